"""What-if: a window of a trace replayed on the deployment as it stands and as a proposed change would make it,
side by side.

The deployment as it stands: its pools' sizes and bounds, its autoscaler (the switch, each pool's metric and
target), its gateway's admission queue, its objectives, its current revision's prefix caching, and the stage models
of its current revision's profiles (the capacity app's `models_for`: a revision without a profile cannot be
replayed, a 400 says how to profile it). A change names what it alters of these (CHANGE_KEYS); everything else
stays as it is.

A request attains its objectives when its TTFT is within the deployment's TTFT objective and its mean inter-token
gap within the ITL objective (the objectives are P99s: ATTAINMENT_TARGET of requests should attain them).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from django.conf import settings

from controlplane.autoscaling.models import AutoscaleMode, AutoscalingPolicy, DeploymentAutoscaling
from controlplane.capacity.services.plans import models_for
from controlplane.capacity.sizing.simulation import Traffic
from controlplane.errors import invalid
from controlplane.models import Deployment
from controlplane.replay.models import Trace
from controlplane.replay.selectors import trace_window
from controlplane.replay.sim.autoscaler import METRICS, AutoscalerPolicy, PoolPolicy
from controlplane.replay.sim.loop import replay
from controlplane.replay.sim.model import Admission, Layout, Objectives, ReplayRequest, Scaling
from controlplane.tenants.selectors import deployment_admission
from inference.gateway.admission import DEFAULT_DEADLINES, DEFAULT_HEADROOM, DEFAULT_MAX_QUEUED
from inference.gateway.fair_queue import BANDS

ATTAINMENT_TARGET = 0.99
CHANGE_KEYS = ("pools", "autoscaling", "admission", "prefix_caching", "routing", "traffic")
ROUTINGS = ("least_loaded", "prefix")
PREFIX_CACHE_BLOCKS = 4096  # blocks a worker's prefix cache holds in a replay (its KV pool in the engine)


@dataclass(slots=True)
class Fleet:
    """What a replay needs of a deployment, as it stands or as changed."""

    mode: str
    replicas: dict[str, int]
    bounds: dict[str, tuple[int, int]]
    autoscale: bool
    policies: dict[str, PoolPolicy]
    max_queued: int
    queue_timeout_s: float
    objectives: Objectives
    prefix_caching: bool
    routing: str = "least_loaded"
    rate: float = 1.0  # arrivals sped up (> 1) or slowed down
    startup_s: float = 30.0
    notes: list[str] = field(default_factory=list)

    def describe(self) -> dict:
        return {"mode": self.mode, "replicas": dict(self.replicas),
                "bounds": {role: list(b) for role, b in self.bounds.items()}, "autoscale": self.autoscale,
                "policies": {role: {"metric": p.metric, "target": p.target} for role, p in self.policies.items()},
                "admission": {"max_queued": self.max_queued, "queue_timeout_s": self.queue_timeout_s},
                "prefix_caching": self.prefix_caching, "routing": self.routing, "traffic_rate": self.rate,
                "startup_s": self.startup_s}


def fleet_of(deployment: Deployment) -> Fleet:
    pools = {pool.role: pool for pool in deployment.pools.all()}
    policies = {p.pool.role: PoolPolicy(p.metric, p.target, pools[p.pool.role].min_replicas,
                                        pools[p.pool.role].max_replicas, p.queue_wait_target)
                for p in AutoscalingPolicy.objects.filter(pool__deployment=deployment, enabled=True)
                .select_related("pool")}
    admission = deployment_admission(deployment) or {}
    deadlines = {**DEFAULT_DEADLINES, **(admission.get("queue_deadlines") or {})}
    engine = (deployment.current_revision.engine_settings or {}) if deployment.current_revision else {}
    caching = any(bool((part or {}).get("prefix_caching")) for part in engine.values() if isinstance(part, dict))
    objectives = deployment.objectives or {}
    return Fleet(mode=deployment.mode, replicas={role: pool.desired_replicas for role, pool in pools.items()},
                 bounds={role: (pool.min_replicas, pool.max_replicas) for role, pool in pools.items()},
                 # An advisory autoscaler only advises: the fleet as it stands does not scale by itself.
                 autoscale=deployment.autoscale_enabled and not DeploymentAutoscaling.objects.filter(
                     deployment=deployment, mode=AutoscaleMode.ADVISORY).exists(), policies=policies,
                 max_queued=admission.get("max_queued", DEFAULT_MAX_QUEUED),
                 queue_timeout_s=deadlines["standard"],
                 objectives=Objectives(objectives.get("ttft_p99_seconds"), objectives.get("itl_p99_seconds")),
                 prefix_caching=caching, startup_s=float(settings.TANDEM_REPLAY_STARTUP_S))


def changed(fleet: Fleet, change: dict) -> Fleet:
    """The fleet after `change`; a 400 naming the first field that is wrong, before anything runs."""
    if not isinstance(change, dict):
        raise invalid("change must be an object", field="change")
    unknown = sorted(set(change) - set(CHANGE_KEYS))
    if unknown:
        raise invalid(f"change.{unknown[0]}: unknown; a change may name {', '.join(CHANGE_KEYS)}",
                      field=f"change.{unknown[0]}")
    out = replace(fleet, replicas=dict(fleet.replicas), bounds=dict(fleet.bounds), policies=dict(fleet.policies))
    for role, pool in _object(change.get("pools", {}), "change.pools").items():
        where = f"change.pools.{role}"
        if role not in out.replicas:
            raise invalid(f"{where}: the deployment has no {role} pool ({', '.join(out.replicas)})", field=where)
        pool = _object(pool, where)
        low, high = out.bounds[role]
        low = _count(pool.get("min_replicas", low), f"{where}.min_replicas", 0)
        high = _count(pool.get("max_replicas", high), f"{where}.max_replicas", 1)
        replicas = _count(pool.get("replicas", min(max(out.replicas[role], low), high)), f"{where}.replicas", 1)
        if not low <= replicas <= high:
            raise invalid(f"{where}.replicas: {replicas} is outside min..max ({low}..{high})", field=where)
        out.replicas[role], out.bounds[role] = replicas, (low, high)
        if role in out.policies:
            out.policies[role] = replace(out.policies[role], min_replicas=low, max_replicas=high)
    scaling = _object(change.get("autoscaling", {}), "change.autoscaling")
    if "enabled" in scaling:
        if not isinstance(scaling["enabled"], bool):
            raise invalid("change.autoscaling.enabled must be true or false", field="change.autoscaling.enabled")
        out.autoscale = scaling["enabled"]
    for role, policy in _object(scaling.get("pools", {}), "change.autoscaling.pools").items():
        where = f"change.autoscaling.pools.{role}"
        if role not in out.replicas:
            raise invalid(f"{where}: the deployment has no {role} pool", field=where)
        policy = _object(policy, where)
        if "enabled" in policy and not isinstance(policy["enabled"], bool):
            raise invalid(f"{where}.enabled must be true or false", field=f"{where}.enabled")
        if policy.get("enabled") is False:  # the pool no longer scales by itself
            out.policies.pop(role, None)
            continue
        current = out.policies.get(role)
        metric = policy.get("metric", current.metric if current else None)
        if metric not in METRICS:
            raise invalid(f"{where}.metric must be one of {', '.join(METRICS)}", field=f"{where}.metric")
        target = _positive(policy.get("target", current.target if current else None), f"{where}.target")
        wait = policy.get("queue_wait_target", current.queue_wait_target if current else None)
        if wait is not None:
            wait = _positive(wait, f"{where}.queue_wait_target")
        low, high = out.bounds[role]
        out.policies[role] = PoolPolicy(metric, target, low, high, wait)
    admission = _object(change.get("admission", {}), "change.admission")
    if "max_queued" in admission:
        out.max_queued = _count(admission["max_queued"], "change.admission.max_queued", 0)
    if "queue_timeout_s" in admission:
        out.queue_timeout_s = _positive(admission["queue_timeout_s"], "change.admission.queue_timeout_s")
    if "prefix_caching" in change:
        if not isinstance(change["prefix_caching"], bool):
            raise invalid("change.prefix_caching must be true or false", field="change.prefix_caching")
        out.prefix_caching = change["prefix_caching"]
    if "routing" in change:
        if change["routing"] not in ROUTINGS:
            raise invalid(f"change.routing must be one of {', '.join(ROUTINGS)}", field="change.routing")
        out.routing = change["routing"]
    traffic = _object(change.get("traffic", {}), "change.traffic")
    if "rate" in traffic:
        out.rate = _positive(traffic["rate"], "change.traffic.rate")
    return out


def _object(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise invalid(f"{where} must be an object", field=where)
    return value


def _count(value, where: str, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= 10_000:
        raise invalid(f"{where} must be a whole number within {least}..10000, not {value!r}", field=where)
    return value


def _positive(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise invalid(f"{where} must be a number > 0, not {value!r}", field=where)
    return float(value)


def requests_of(trace: Trace, *, since_s: float | None, until_s: float | None, rate: float = 1.0,
                limit: int | None = None) -> list[ReplayRequest]:
    """The window's requests as the replay takes them, times from the window's first arrival (divided by `rate`).
    A request with no measured output (shed, cut) asks for its max_tokens, else the window's mean output."""
    limit = limit or settings.TANDEM_REPLAY_MAX_REQUESTS
    rows = list(trace_window(trace, since_s=since_s, until_s=until_s).values_list(
        "at_s", "prompt_tokens", "completion_tokens", "max_tokens", "tenant", "priority", "hashes",
        "block_tokens")[:limit + 1])
    if len(rows) > limit:
        raise invalid(f"the window holds more than {limit} requests (TANDEM_REPLAY_MAX_REQUESTS): give a narrower "
                      "since..until", field="until")
    if not rows:
        raise invalid(f"trace {trace.name!r} holds no request in this window", field="trace")
    measured = [r[2] for r in rows if r[2] > 0]
    mean_output = max(1, round(sum(measured) / len(measured))) if measured else 16
    first = rows[0][0]
    return [ReplayRequest(arrival_s=(at - first) / rate, prompt_tokens=max(1, prompt),
                          output_tokens=completion if completion > 0 else (max_tokens or mean_output),
                          tenant=tenant, priority=priority if priority in BANDS else "",
                          block_hashes=tuple(hashes or ()), block_tokens=max(1, block_tokens or 16))
            for at, prompt, completion, max_tokens, tenant, priority, hashes, block_tokens in rows]


def run(deployment: Deployment, fleet: Fleet, requests: list[ReplayRequest]) -> dict:
    prompt_mean = sum(r.prompt_tokens for r in requests) / len(requests)
    output_mean = sum(r.output_tokens for r in requests) / len(requests)
    models = models_for(deployment, Traffic(1.0, prompt_mean, output_mean))
    roles = ("colocated",) if fleet.mode == "colocated" else ("prefill", "decode")
    layout = Layout(fleet.mode, 0 if fleet.mode == "colocated" else fleet.replicas["prefill"],
                    fleet.replicas["colocated" if fleet.mode == "colocated" else "decode"])
    policy = AutoscalerPolicy({role: p for role, p in fleet.policies.items() if role in roles},
                              max_step=settings.TANDEM_AUTOSCALE_MAX_STEP,
                              step_period_s=settings.TANDEM_AUTOSCALE_STEP_PERIOD_S,
                              down_window_s=settings.TANDEM_AUTOSCALE_DOWN_STABILIZATION_S,
                              up_window_s=settings.TANDEM_AUTOSCALE_UP_STABILIZATION_S,
                              tolerance=settings.TANDEM_AUTOSCALE_TOLERANCE_PCT / 100) \
        if fleet.autoscale and fleet.policies else None
    result = replay(requests, models={role: models[role] for role in roles}, layout=layout,
                    admission=Admission(queue_size=fleet.max_queued, queue_timeout_s=fleet.queue_timeout_s,
                                        headroom=DEFAULT_HEADROOM),
                    objectives=fleet.objectives,
                    scaling=Scaling(policy=policy, interval_s=float(settings.TANDEM_SCRAPE_INTERVAL_S),
                                    startup_s=fleet.startup_s),
                    prefix_cache_blocks=PREFIX_CACHE_BLOCKS if fleet.prefix_caching else 0, routing=fleet.routing)
    return _finite(result.as_dict())


def _finite(value):
    """NaN and infinities (no sample) as null: JSON has neither."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def what_if(deployment: Deployment, trace: Trace, *, change: dict, since_s: float | None = None,
            until_s: float | None = None) -> dict:
    """Before and after, on the same window of the trace."""
    before = fleet_of(deployment)
    after = changed(before, change)
    requests = requests_of(trace, since_s=since_s, until_s=until_s)
    after_requests = requests if after.rate == 1.0 else requests_of(trace, since_s=since_s, until_s=until_s,
                                                                    rate=after.rate)
    results = {"before": run(deployment, before, requests), "after": run(deployment, after, after_requests)}
    target = ATTAINMENT_TARGET
    attain = {side: results[side]["slo_attainment"] for side in results}
    return {"deployment": deployment.name,
            "trace": {"name": trace.name, "since_s": since_s, "until_s": until_s, "requests": len(requests),
                      "span_s": requests[-1].arrival_s - requests[0].arrival_s},
            "objectives": {"ttft_p99_s": before.objectives.ttft_s, "itl_p99_s": before.objectives.itl_s,
                           "attainment_target": target},
            "change": change, "fleet": {"before": before.describe(), "after": after.describe()},
            **results,
            "verdict": {"attainment_before": attain["before"], "attainment_after": attain["after"],
                        "meets_objective": attain["after"] is not None and attain["after"] >= target,
                        "worse": (attain["after"] or 0.0) < (attain["before"] or 0.0) - 0.005}}
