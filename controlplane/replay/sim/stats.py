"""What a replay reports, and what it records on the way.

Requests arriving before warmup_s are served but not counted. Latencies of counted requests: TTFT from arrival to
first token (the gateway's queue wait included), e2e to the last token, queue wait to dispatch; ITL over every
token gap, each decode step's shared gap weighted by the sequences it served (a gap is counted when its step ends
at or after warmup_s). SLO attainment: the share of offered requests that were served with TTFT and mean gap within
the objectives. Quantiles are nearest-rank.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from controlplane.replay.sim.model import Objectives
from controlplane.replay.sim.state import Flight

QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def quantiles(values, counts=None, qs=QUANTILES) -> dict[str, float | None]:
    """name → the q-quantile (nearest rank) of `values`, each weighted by `counts` (None: 1 each)."""
    if not len(values):
        return {name: None for name in qs}
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(np.ones(len(values)) if counts is None else np.asarray(counts, dtype=float)[order])
    total = cumulative[-1]
    return {name: float(values[order[min(int(np.searchsorted(cumulative, q * total - 1e-9)), len(values) - 1)]])
            for name, q in qs.items()}


def p99(values, counts=None) -> float | None:
    return quantiles(values, counts, {"p99": 0.99})["p99"]


class Window:
    """Per role, what the pool's workers measured since the last scaling evaluation."""

    def __init__(self, roles) -> None:
        self.ttfts = {role: [] for role in roles}
        self.gaps = {role: ([], []) for role in roles}
        self.e2es = {role: [] for role in roles}
        self.num_served = dict.fromkeys(roles, 0)
        self.queue_waits: list[float] = []


class Recorder:
    def __init__(self, roles, warmup_s: float, windowed: bool) -> None:
        self.roles, self.warmup_s, self.windowed = tuple(roles), warmup_s, windowed
        self.gap_values: list[float] = []
        self.gap_counts: list[int] = []
        self.window = Window(self.roles)

    def gap(self, role: str, seconds: float, count: int, now: float) -> None:
        if now >= self.warmup_s:
            self.gap_values.append(seconds)
            self.gap_counts.append(count)
        if self.windowed:
            values, counts = self.window.gaps[role]
            values.append(seconds)
            counts.append(count)

    def first_token(self, role: str, flight: Flight) -> None:
        if self.windowed:
            self.window.ttfts[role].append(flight.first_token - flight.dispatched)
            if role == "prefill":
                self.window.num_served[role] += 1

    def dispatched(self, flight: Flight) -> None:
        if self.windowed:
            self.window.queue_waits.append(flight.dispatched - flight.arrival)

    def finished(self, role: str, flight: Flight) -> None:
        if self.windowed:
            self.window.e2es[role].append(flight.finished - flight.dispatched)
            self.window.num_served[role] += 1

    def next_window(self) -> Window:
        window, self.window = self.window, Window(self.roles)
        return window


@dataclass(slots=True)
class ReplayResult:
    duration_s: float  # from warmup_s to the end of the last request
    offered: int
    served: int
    shed: dict[str, int]  # reason → requests
    slo_attainment: float | None  # None: nothing offered
    goodput_rps: float  # attaining requests per second
    goodput_tokens_per_s: float  # their output tokens per second
    ttft_s: dict[str, float | None]
    itl_s: dict[str, float | None]
    e2e_s: dict[str, float | None]
    queue_wait_s: dict[str, float | None]
    prefix_hit_rate: float | None  # cached prompt tokens / prompt tokens of counted prefills (None: no cache)
    utilisation: dict[str, float]  # role → busy share of its serving time
    worker_hours: dict[str, float]  # role → Σ up time, start-up included; "total"
    tenants: dict[str, dict] = field(default_factory=dict)  # tenant → offered, served, shed, attainment, P99s
    timeline: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def attains(flight: Flight, objectives: Objectives) -> bool:
    if flight.shed is not None or math.isnan(flight.finished):
        return False
    if objectives.ttft_s is not None and flight.first_token - flight.arrival > objectives.ttft_s:
        return False
    return objectives.itl_s is None or flight.mean_gap() <= objectives.itl_s


def build_result(flights: list[Flight], recorder: Recorder, fleet, objectives: Objectives, *, horizon: float,
                 bucket_s: float, cache_on: bool) -> ReplayResult:
    counted = [f for f in flights if f.counted]
    served = [f for f in counted if f.shed is None and not math.isnan(f.finished)]
    shed: dict[str, int] = {}
    for flight in counted:
        if flight.shed is not None:
            shed[flight.shed] = shed.get(flight.shed, 0) + 1
    good = [f for f in served if attains(f, objectives)]
    duration = max(horizon - recorder.warmup_s, 1e-9)
    prefilled = [f for f in counted if f.started]
    prompt_tokens = sum(f.prompt for f in prefilled)
    dispatched = [f.dispatched - f.arrival for f in counted if not math.isnan(f.dispatched)]
    return ReplayResult(
        duration_s=duration, offered=len(counted), served=len(served), shed=dict(sorted(shed.items())),
        slo_attainment=len(good) / len(counted) if counted else None,
        goodput_rps=len(good) / duration, goodput_tokens_per_s=sum(f.output for f in good) / duration,
        ttft_s=quantiles([f.first_token - f.arrival for f in served]),
        itl_s=quantiles(recorder.gap_values, recorder.gap_counts),
        e2e_s=quantiles([f.finished - f.arrival for f in served]),
        queue_wait_s=quantiles(dispatched),
        prefix_hit_rate=(sum(f.num_cached for f in prefilled) / prompt_tokens) if cache_on and prompt_tokens else None,
        utilisation={role: min(1.0, sum(r.busy_s for r in replicas) / max(
            sum(r.serving_s(horizon) for r in replicas), 1e-9)) for role, replicas in fleet.pools.items()},
        worker_hours=_worker_hours(fleet, horizon), tenants=_tenants(counted, objectives),
        timeline=timeline(flights, fleet, horizon, bucket_s))


def _tenants(counted: list[Flight], objectives: Objectives) -> dict[str, dict]:
    by_tenant: dict[str, list[Flight]] = {}
    for flight in counted:
        by_tenant.setdefault(flight.tenant, []).append(flight)
    out = {}
    for tenant, flights in sorted(by_tenant.items()):
        served = [f for f in flights if f.shed is None]
        out[tenant] = {"offered": len(flights), "served": len(served), "shed": len(flights) - len(served),
                       "slo_attainment": sum(attains(f, objectives) for f in flights) / len(flights),
                       "ttft_p99_s": p99([f.first_token - f.arrival for f in served]),
                       "queue_wait_p99_s": p99([f.dispatched - f.arrival for f in flights
                                                if not math.isnan(f.dispatched)])}
    return out


def _worker_hours(fleet, horizon: float) -> dict[str, float]:
    hours = {role: sum(r.up_s(horizon) for r in replicas) / 3600 for role, replicas in fleet.pools.items()}
    hours["total"] = sum(hours.values())
    return hours


def timeline(flights: list[Flight], fleet, horizon: float, bucket_s: float) -> list[dict]:
    """Per bucket of bucket_s, every request (warm-up too): arrivals, served and shed by when they ended, pool
    sizes at the bucket's end and the P99 TTFT of the first tokens in it."""
    num = int(horizon // bucket_s) + 1
    arrivals, served, shed = [0] * num, [0] * num, [0] * num
    ttfts: list[list[float]] = [[] for _ in range(num)]
    for flight in flights:
        arrivals[min(int(flight.arrival // bucket_s), num - 1)] += 1
        if flight.shed is not None:
            shed[min(int(flight.shed_at // bucket_s), num - 1)] += 1
            continue
        if not math.isnan(flight.first_token):
            ttfts[min(int(flight.first_token // bucket_s), num - 1)].append(flight.first_token - flight.arrival)
        if not math.isnan(flight.finished):
            served[min(int(flight.finished // bucket_s), num - 1)] += 1
    sizes = fleet.sizes_at([(i + 1) * bucket_s for i in range(num)])
    return [{"start_s": i * bucket_s, "arrivals": arrivals[i], "served": served[i], "shed": shed[i],
             "replicas": sizes[i], "ttft_p99_s": p99(ttfts[i])} for i in range(num)]
