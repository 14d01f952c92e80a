"""What a replay takes: the trace's requests, the layout, the gateway's admission, the objectives and the scaling,
and what a scaling policy reads at each evaluation. Plain frozen values; `replay` (loop.py) checks them at its edge.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from inference.gateway.fair_queue import BANDS

LAYOUTS = ("disaggregated", "colocated")
DEFAULT_CLASS = "standard"  # the class of a request whose priority is "" (the gateway's ANONYMOUS_CLASS)


@dataclass(frozen=True, slots=True)
class ReplayRequest:
    """One request of a trace. `arrival_s`: seconds from the trace's start. `block_hashes`: chained hashes of the
    prompt's leading full blocks of `block_tokens` tokens, so two requests share a cached prefix of k blocks when
    their first k hashes are equal. `priority`: a class name of the gateway's bands ("": standard)."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tenant: str = ""
    priority: str = ""
    block_hashes: tuple = ()
    block_tokens: int = 16


@dataclass(frozen=True, slots=True)
class Layout:
    """`disaggregated`: prefill_replicas + decode_replicas; `colocated`: decode_replicas colocated workers (and
    prefill_replicas 0)."""

    mode: str
    prefill_replicas: int
    decode_replicas: int

    def roles(self) -> dict[str, int]:
        """Role → replicas at the trace's start."""
        if self.mode == "colocated":
            return {"colocated": self.decode_replicas}
        return {"prefill": self.prefill_replicas, "decode": self.decode_replicas}


@dataclass(frozen=True, slots=True)
class Admission:
    """The gateway's admission queue (admission.py and fair_queue.py in inference/gateway/).

    max_running: requests in the workers at once (None: unbounded, unless `headroom` is set); queue_size: requests
    that may wait (None: unbounded; 0: none, a request finding every slot taken is shed); queue_timeout_s: how long
    one may wait before it is shed (None: forever); fair: per-tenant fair queuing by virtual token counters (False:
    arrival order within each band); priority_weights: class → weight; None keeps the gateway's strict priority
    bands, a dict puts every class in one band whose tenants' counters grow by their tokens / their class's weight.
    headroom: with max_running None, the gateway's own bound, which follows scaling: each serving streaming worker
    (decode or colocated) holds its max_num_seqs + headroom (the gateway's --worker-capacity-headroom)."""

    max_running: int | None = None
    queue_size: int | None = None
    queue_timeout_s: float | None = None
    fair: bool = True
    priority_weights: dict | None = None
    headroom: int | None = None


@dataclass(frozen=True, slots=True)
class Objectives:
    """A request attains when its TTFT (arrival to first token, queue wait included) is at most ttft_s and its mean
    inter-token gap at most itl_s; None does not constrain."""

    ttft_s: float | None
    itl_s: float | None


@dataclass(frozen=True, slots=True)
class PoolObservation:
    """One pool as the real autoscaler reads it, over the last evaluation interval (latencies as its workers
    measure them: from dispatch, without the gateway's queue wait)."""

    replicas: int  # desired: serving + starting
    ready: int  # serving
    running: int  # sequences in the pool's workers now
    waiting: int  # requests in the pool's workers' own queues now
    utilisation: float  # busy share of the ready workers over the interval
    ttft_p99_s: float | None
    itl_p99_s: float | None
    e2e_p99_s: float | None
    kv_usage: float  # reserved KV / capacity, mean over the ready workers
    num_served: int  # requests whose stage in this pool ended in the interval (the real reader's qps)
    manual_scale_at: float | None  # the last schedule change of this pool


@dataclass(frozen=True, slots=True)
class Observation:
    pools: dict[str, PoolObservation]
    queue_length: int  # requests waiting in the gateway's admission queue now
    queue_wait_p99_s: float | None  # of the requests admitted over the interval (None: none)


class ScalingPolicy(Protocol):
    def decide(self, now: float, observed: Observation) -> dict[str, int] | None:
        """Role → replicas wanted (roles left out keep their size), or None for no change."""


@dataclass(frozen=True, slots=True)
class Scaling:
    """Pool-size changes during the replay: `schedule` [(time_s, role, replicas)] and an optional `policy` asked
    every interval_s. A new worker serves startup_s after it is asked for; a removed one drains (takes no new
    request, finishes those it holds)."""

    schedule: tuple = ()
    policy: ScalingPolicy | None = None
    interval_s: float = 5.0  # the real autoscaler runs once per scrape interval (TANDEM_SCRAPE_INTERVAL_S)
    startup_s: float = 0.0


def band_of(request: ReplayRequest) -> str:
    return request.priority or DEFAULT_CLASS


def check_inputs(requests, models: dict, layout: Layout, admission: Admission, scaling: Scaling | None) -> None:
    """ValueError naming what is wrong, before anything runs."""
    if layout.mode not in LAYOUTS:
        raise ValueError(f"layout.mode must be one of {', '.join(LAYOUTS)}, not {layout.mode!r}")
    if layout.mode == "colocated" and layout.prefill_replicas:
        raise ValueError("a colocated layout has no prefill pool: give its workers as decode_replicas")
    roles = layout.roles()
    if set(models) != set(roles):
        raise ValueError(f"models must give a StageModel for each role of the layout: {sorted(roles)}, "
                         f"not {sorted(models)}")
    for role, replicas in roles.items():
        if replicas < 0:
            raise ValueError(f"layout: {role} replicas must be >= 0, not {replicas}")
    for name, least in (("max_running", 1), ("queue_size", 0), ("headroom", 0)):
        value = getattr(admission, name)
        if value is not None and value < least:
            raise ValueError(f"admission.{name} must be >= {least}, not {value}")
    if admission.queue_timeout_s is not None and not admission.queue_timeout_s > 0:
        raise ValueError(f"admission.queue_timeout_s must be > 0, not {admission.queue_timeout_s}")
    for name, weight in (admission.priority_weights or {}).items():
        if name not in BANDS or not weight > 0:
            raise ValueError(f"admission.priority_weights: {name!r} must be one of {', '.join(BANDS)} with a "
                             f"weight > 0, not {weight!r}")
    if scaling is not None:
        if not scaling.interval_s > 0 or scaling.startup_s < 0:
            raise ValueError("scaling: interval_s must be > 0 and startup_s >= 0")
        for entry in scaling.schedule:
            time_s, role, replicas = entry
            if role not in roles or replicas < 0:
                raise ValueError(f"scaling.schedule: {entry!r} needs a role of the layout and replicas >= 0")
    for i, request in enumerate(requests):
        if request.prompt_tokens < 1 or request.output_tokens < 1:
            raise ValueError(f"requests[{i}]: prompt_tokens and output_tokens must be >= 1")
        if request.block_tokens < 1:
            raise ValueError(f"requests[{i}]: block_tokens must be >= 1")
        if band_of(request) not in BANDS:
            raise ValueError(f"requests[{i}]: priority {request.priority!r} is none of {', '.join(BANDS)}")
