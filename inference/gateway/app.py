"""The gateway's HTTP surface: OpenAI routes, /health, /metrics, /trace, and the deployments it serves.

A per-deployment gateway serves one deployment (ServedDeployment, deployment.py), given by the command line or polled
from the control plane; a shared gateway serves every deployment the control plane attaches to it, each by its model
name, with one membership poll for all (shared_membership.py). A generation request runs the steps of pipeline.py
inside the deployment its `model` names.
"""
from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
from aiohttp import web
from prometheus_client import Counter, PlatformCollector, ProcessCollector
from prometheus_client.registry import CollectorRegistry

from inference.gateway import operator_views, pipeline
from inference.gateway.config import Config
from inference.gateway.deployment import ServedDeployment, model_not_found
from inference.gateway.key_throttle import KeyThrottle
from inference.gateway.membership import ControlPlaneMembership, apply_static
from inference.gateway.openai_protocol import ApiError, Endpoint, requested_model
from inference.gateway.pipeline import error_response
from inference.gateway.shared_membership import Attached, SharedMembership
from inference.metrics import BASE_LABELS

log = logging.getLogger("tandem.gateway")

CONFIG_KEY = web.AppKey("config", Config)
GATEWAY_KEY = web.AppKey("gateway", object)
RETIRE_POLL_S = 0.5


class Gateway:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.created = int(time.time())
        self.shared = config.shared_gateway is not None
        self.deployments: dict[str, ServedDeployment] = {}  # by the model its clients send
        self.key_throttle = KeyThrottle()  # wrong keys per client address (key_throttle.py)
        self.session: aiohttp.ClientSession | None = None
        self.membership: ControlPlaneMembership | None = None
        self.shared_membership: SharedMembership | None = None
        # The shared gateway's own series: the process's, and requests refused before their deployment was known
        # (a key no deployment knows, a body that is not JSON, an unknown model), under model "".
        self.registry = CollectorRegistry()
        if self.shared:
            ProcessCollector(registry=self.registry)
            PlatformCollector(registry=self.registry)
            self._refusals = Counter("tandem_request_errors", "Requests that failed, by kind.",
                                     (*BASE_LABELS, "revision", "kind"), registry=self.registry)
            self.shared_membership = SharedMembership(config, self.attach)
        else:
            served = ServedDeployment(config, config.served_model_name, name=config.deployment,
                                      worker_key=config.worker_key, quota_path=config.quota_state)
            self.deployments[served.model] = served
            if config.control_plane_url:
                self.membership = ControlPlaneMembership(config, served.router, on_answer=served.take_answer)
        self._tasks: list[asyncio.Task] = []
        self._retiring: set[ServedDeployment] = set()

    def served(self) -> list[ServedDeployment]:
        return list(self.deployments.values())

    # -- lifecycle ----------------------------------------------------------------------------------------------------

    async def start(self, app: web.Application) -> None:
        # One pooled keep-alive session for every worker call: a fresh TCP connection per request would cost more
        # than the gateway's whole latency budget. No pool limit: backpressure is --max-outstanding-per-worker.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=None, connect=self.config.connect_timeout,
                                        sock_connect=self.config.connect_timeout,
                                        sock_read=self.config.request_timeout)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        # One membership poll and one health round before the port listens (aiohttp starts the site after its
        # startup hooks): a gateway that starts or restarts in front of a serving fleet answers its first request
        # instead of 503 "no membership yet". Each step is bounded by its own timeout; a control plane that does
        # not answer leaves the gateway listening with the error on /health, as before.
        if self.shared_membership is not None:
            await self.shared_membership.poll_once(self.session)  # starts each deployment (attach)
            self._tasks.append(asyncio.create_task(self.shared_membership.run(self.session), name="membership"))
            return
        (served,) = self.served()
        if self.membership is None:
            apply_static(self.config, served.router)
        else:
            await self.membership.poll_once(self.session)
        await served.start(self.session)
        if self.membership is not None:
            self._tasks.append(asyncio.create_task(self.membership.run(self.session), name="membership"))

    async def stop(self, app: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for served in [*self.served(), *self._retiring]:
            await served.stop()
        if self.session is not None:
            await self.session.close()

    async def attach(self, attached: list[Attached]) -> None:
        """A shared gateway's good answer: start the deployments it lists anew, apply each good item, and retire
        the deployments it no longer lists (they finish what they hold, then stop)."""
        listed = {a.model for a in attached}
        for model in [m for m in self.deployments if m not in listed]:
            served = self.deployments.pop(model)
            log.info("deployment %s is no longer served here: it stops once its requests finish", served.name)
            self._retiring.add(served)
            self._tasks.append(asyncio.create_task(self._retire(served), name=f"retire {served.name}"))
        for item in attached:
            served = self.deployments.get(item.model)
            is_new = served is None
            if is_new:
                path = self.config.quota_state
                served = ServedDeployment(
                    self.config, item.model, name=item.name, worker_key=self.config.worker_keys.get(item.name),
                    process_metrics=False,
                    quota_path=None if path is None else path.with_name(f"{path.stem}.{item.name}{path.suffix}"))
            if item.answer is not None:
                served.router.set_groups(item.answer.mode, item.answer.groups)
                served.take_answer(item.answer)
            elif not served.router.groups:
                served.router.membership_error = item.error
            if is_new:
                await served.start(self.session)
                self.deployments[item.model] = served
                log.info("serving deployment %s as model %s", item.name, item.model)

    async def _retire(self, served: ServedDeployment) -> None:
        deadline = asyncio.get_running_loop().time() + self.config.request_timeout
        while not served.is_idle and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(RETIRE_POLL_S)
        await served.stop()
        self._retiring.discard(served)

    # -- what the request steps ask of the gateway (pipeline.Gateway) -------------------------------------------------

    def identify_caller(self, request: web.Request) -> None:
        """Step 1: the caller's key, before the body is read. Behind the throttle on wrong keys per address; a
        per-deployment gateway answers its deployment's 401 or 404 here, a shared one 401 only for a caller that no
        deployment here would serve (which deployment it asks for, the body says)."""
        self.key_throttle.check(request.remote)
        if not self.shared:
            pipeline.identify(self, self.served()[0], request)
            return
        self._visible(request)

    def _visible(self, request: web.Request) -> list[ServedDeployment]:
        """The deployments that would serve the caller; a shared gateway's 401 where none would and one refused
        its key, which then counts as a wrong key once."""
        visible, refusals = [], []
        for served in self.served():
            try:
                served.identify(request.headers.get("Authorization"))
                visible.append(served)
            except ApiError as error:
                refusals.append(error)
        if not visible and refusals and all(error.status == 401 for error in refusals):
            error = next((e for e in refusals if e.code == "invalid_api_key"), refusals[0])
            if error.code == "invalid_api_key":
                self.key_throttle.failed(request.remote)
            raise error
        return visible

    def deployment_for(self, body: dict) -> ServedDeployment:
        """Step 3: the deployment whose model the body names. A per-deployment gateway leaves a wrong or missing
        `model` to the request's validation (openai_protocol), which names what it serves."""
        if not self.shared:
            return self.served()[0]
        model = requested_model(body)
        served = self.deployments.get(model)
        if served is None:
            raise model_not_found(model)
        return served

    def count_refusal(self, served: ServedDeployment | None, code: str) -> None:
        if served is None and not self.shared:
            served = self.served()[0]
        if served is not None:
            served.metrics.count_error(code)
        else:
            self._refusals.labels(role="gateway", model="", revision="", kind=code).inc()

    # -- routes -------------------------------------------------------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await pipeline.generate(self, request, Endpoint.COMPLETIONS)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await pipeline.generate(self, request, Endpoint.CHAT)

    async def models(self, request: web.Request) -> web.Response:
        """operator_views.models of the deployments the caller may use: a deployment that requires a key lists its
        model to a key of a tenant allowed there only."""
        try:
            if not self.shared:
                self.identify_caller(request)
                visible = self.served()
            else:
                self.key_throttle.check(request.remote)
                visible = self._visible(request)
        except ApiError as error:
            return error_response(error)
        return operator_views.models(self, visible, request)

    async def health(self, request: web.Request) -> web.Response:
        return await operator_views.health(self, request)

    async def prometheus(self, request: web.Request) -> web.Response:
        return await operator_views.metrics(self, request)

    async def trace_page(self, request: web.Request) -> web.Response:
        return operator_views.trace(self, request)


@web.middleware
async def openai_errors(request: web.Request, handler):
    """Unknown routes and wrong methods answer in OpenAI's error shape too, so clients parse every error alike."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(ApiError(exc.status, f"{request.method} {request.path}: {exc.reason}",
                                       code="not_found" if exc.status == 404 else None))
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        # A bug, not a client error: logged with its traceback, answered in the shape clients parse.
        log.exception("unhandled error in %s %s", request.method, request.path)
        return error_response(ApiError(500, "internal gateway error (logged)", type="server_error",
                                       code="internal_error"))


def build_app(config: Config) -> web.Application:
    gateway = Gateway(config)
    # client_max_size backs up read_body's Content-Length check for chunked bodies.
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[openai_errors])
    app[CONFIG_KEY] = config
    app[GATEWAY_KEY] = gateway
    app.on_startup.append(gateway.start)
    app.on_cleanup.append(gateway.stop)
    app.router.add_post("/v1/completions", gateway.completions)
    app.router.add_post("/v1/chat/completions", gateway.chat_completions)
    app.router.add_get("/v1/models", gateway.models)
    app.router.add_get("/health", gateway.health)
    app.router.add_get("/metrics", gateway.prometheus)
    app.router.add_get("/trace", gateway.trace_page)
    return app
