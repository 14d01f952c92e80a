"""One deployment as a gateway serves it: its workers (Router), admission queue and preemption, tenants, request
trace, sampling defaults, ITL objective and series, keyed by the `model` its clients send.

A per-deployment gateway holds one; a shared gateway (docs/gateway.md, "Shared gateway") holds one per deployment
the control plane attaches to it, so that each keeps what is its own — a tenant's key and limits, a full queue, a
canary's weights — exactly as behind a gateway of its own, while the gateway's process, port, worker session and
membership poll are shared.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp

from inference.gateway import health_probe, quota_state
from inference.gateway.admission import Admission
from inference.gateway.config import Config
from inference.gateway.membership import DeploymentAnswer
from inference.gateway.metrics import GatewayMetrics
from inference.gateway.openai_protocol import ApiError
from inference.gateway.preemption import Preemption, preemption_settings
from inference.gateway.relay import Relay
from inference.gateway.routing import Router
from inference.gateway.tenancy import TenantGate, TenantState
from inference.gateway.tenant_policy import OPEN, Tenancy
from inference.gateway.trace_log import TraceLog


class ServedDeployment:
    """A deployment's state at the gateway. Static settings come from the config; a control plane's come with each
    good membership answer (`take_answer`), the router's groups with it (membership.py)."""

    def __init__(self, config: Config, model: str, *, name: str | None = None, worker_key: str | None = None,
                 process_metrics: bool = True, quota_path: Path | None = None) -> None:
        self.config, self.model, self.name = config, model, name or model
        self.created = int(time.time())
        self.router = Router(config)
        self.metrics = GatewayMetrics(model=model, router=self.router, process=process_metrics)
        self.admission = Admission(self.router.capacity, max_queued=config.max_queued,
                                   deadlines=config.queue_deadlines)
        self.preemption = Preemption(self.admission, config.preemption)
        # A static gateway's flags; with a control plane, the last good answer's (the flags are refused there).
        self.sampling_defaults: dict = config.sampling_defaults
        self.itl_objective_s: float | None = config.itl_objective_s
        self.tenancy: Tenancy = OPEN  # the last good answer's: enforced while the control plane is away
        self.tenants = TenantGate(lambda: self.tenancy)
        self.trace = TraceLog(config.trace_size, config.trace_sample, deployment=self.name)
        self.worker_key = worker_key
        self.quota_path = quota_path  # tenants' minute of usage across a restart (quota_state.py)
        self.relay: Relay | None = None
        self.num_running = 0
        for collector in (self.tenants.collector(model), self.admission.collector(model),
                          self.preemption.collector(model)):
            self.metrics.registry.register(collector)
        self._tasks: list[asyncio.Task] = []

    def take_answer(self, answer: DeploymentAnswer) -> None:
        """The deployment's settings of a good membership answer (its groups are the router's already)."""
        self.sampling_defaults = answer.sampling_defaults
        self.itl_objective_s = answer.itl_objective_s
        self.tenancy = answer.tenancy
        # The deployment's admission settings override the flags; what they leave out, the flags say.
        settings = answer.admission
        self.admission.configure(max_queued=settings.get("max_queued", self.config.max_queued),
                                 deadlines={**self.config.queue_deadlines, **settings.get("queue_deadlines", {})})
        self.preemption.configure(preemption_settings(settings, self.config.preemption))

    def identify(self, authorization: str | None) -> TenantState | None:
        """The caller's tenant here (TenantGate.identify): 401 for a key this deployment requires and does not know,
        404 model_not_found for a tenant that may not use it."""
        return self.tenants.identify(authorization, self.model)

    @property
    def is_idle(self) -> bool:
        """Nothing runs or waits: a deployment detached from a shared gateway may stop."""
        return self.num_running == 0 and not any(self.admission.queue.queued().values())

    # -- lifecycle ----------------------------------------------------------------------------------------------------

    async def start(self, session: aiohttp.ClientSession) -> None:
        """Probe the workers once (a gateway that starts in front of a serving fleet answers its first request), then
        run the health loop, the admission queue and the saving of tenants' usage."""
        self.relay = Relay(self.config, self.router, session, on_retry=self.metrics.count_retry,
                           on_migration=self.metrics.count_migration, model=self.model, worker_key=self.worker_key)
        await health_probe.probe_all(self.router, session)
        self._tasks.append(asyncio.create_task(health_probe.run_health_loop(self.router, session), name=f"health {self.name}"))
        self._tasks.append(asyncio.create_task(self.admission.run(), name=f"admission {self.name}"))
        if self.quota_path is not None:
            quota_state.load(self.tenants, self.quota_path)
            self._tasks.append(asyncio.create_task(quota_state.run(self.tenants, self.quota_path),
                                                   name=f"quota-state {self.name}"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self.quota_path is not None:
            quota_state.save_quietly(self.tenants, self.quota_path)


def model_not_found(model: str) -> ApiError:
    """OpenAI's 404 for a model a shared gateway does not serve; worded as a tenant's refusal (tenancy.py) is, so
    that it does not tell a caller which models exist behind the gateway."""
    return ApiError(404, f"The model '{model}' does not exist or you do not have access to it.", param="model",
                    code="model_not_found")
