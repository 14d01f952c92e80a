"""Plans against the fleet: stage models from the stored profiles, the replica search (sizing.search) over them
with what-if factors, "apply" (one audited scale action per pool, through pool_scale), and what one replica carries
for predictive floors."""
from __future__ import annotations

import math

from django.conf import settings
from django.db import transaction

from controlplane.capacity.autoscale_targets import policy_targets
from controlplane.capacity.models import Profile
from controlplane.capacity.selectors import profiles_by_role, traffic_from_metrics
from controlplane.capacity.sizing.curves import DecodeCurve, PrefillCurve
from controlplane.capacity.sizing.search import (LAYOUTS, Objectives, Prices, colocated_model, plan,
                                                 replica_capacity_rps)
from controlplane.capacity.sizing.simulation import StageModel, Traffic
from controlplane.errors import invalid
from controlplane.models import Deployment, Pool
from controlplane.services import pool_scale


def stage_model(profile: Profile, *, traffic_prompt_tokens: float = 0.0) -> StageModel:
    """A profile as the simulation's StageModel; a part the profile lacks is left at zero cost (the planner only
    reads the part of the role it plans)."""
    fits = profile.fits or {}
    prefill = PrefillCurve(**fits["prefill"]) if "prefill" in fits else PrefillCurve(0.0, 0.0)
    decode = DecodeCurve(**fits["decode"]) if "decode" in fits else DecodeCurve(0.0, 0.0)
    kv_per_token = (fits.get("kv_transfer") or {}).get("seconds_per_token", 0.0)
    return StageModel(prefill=prefill, decode=decode, max_num_seqs=profile.max_num_seqs or 64,
                      max_batch_tokens=profile.max_batch_tokens or 2048,
                      kv_capacity_tokens=profile.kv_capacity_tokens or (1 << 30),
                      kv_transfer_s=kv_per_token * traffic_prompt_tokens,
                      request_overhead_s=(fits.get("overhead") or {}).get("request_s", 0.0))


def models_for(deployment: Deployment, traffic: Traffic, node_class: str | None = None) -> dict[str, StageModel]:
    """{"prefill", "decode", "colocated"} stage models: measured where profiled, and the other layout's derived
    from them (a colocated worker from the prefill and decode curves; disaggregated pools from a colocated profile's
    curves, with no KV push cost measured). 400 when the revision has no profile."""
    profiles = profiles_by_role(deployment, node_class)
    if not profiles:
        raise invalid(f"deployment {deployment.name!r} has no profile of its current revision yet: run "
                      f"`manage.py tandem_profile {deployment.name}` or POST its /profiles", field="deployment")
    models = {role: stage_model(p, traffic_prompt_tokens=traffic.prompt_tokens_mean) for role, p in profiles.items()}
    if "prefill" in models and "decode" in models:
        models.setdefault("colocated", colocated_model(models["prefill"], models["decode"]))
    elif "colocated" in models:
        models.setdefault("prefill", models["colocated"])
        models.setdefault("decode", models["colocated"])
    else:
        missing = sorted({"prefill", "decode"} - set(models))
        raise invalid(f"the profile of {deployment.name!r} lacks the {missing[0]} role", field="deployment")
    return models


def plan_compute(*, deployment: Deployment, traffic: Traffic, objectives: Objectives, prices: Prices,
                 what_if: dict | None = None, node_class: str | None = None, num_requests: int = 400) -> dict:
    """The planner's answer for the deployment's profiles, after the what-if factors (traffic ×, prompt length ×,
    output length ×) are applied to the traffic profile."""
    what_if = what_if or {}
    traffic = traffic.scaled(rate=what_if.get("traffic", 1.0), prompt=what_if.get("prompt_length", 1.0),
                             output=what_if.get("output_length", 1.0))
    models = models_for(deployment, traffic, node_class)
    result = plan(models=models, traffic=traffic, objectives=objectives, prices=prices, layouts=LAYOUTS,
                  num_requests=num_requests)
    current = {pool.role: pool.desired_replicas for pool in deployment.pools.all()}
    return {"deployment": deployment.name, "mode": deployment.mode,
            "traffic": {"requests_per_s": traffic.requests_per_s, "prompt_tokens_mean": traffic.prompt_tokens_mean,
                        "output_tokens_mean": traffic.output_tokens_mean},
            "objectives": {"ttft_p99_s": objectives.ttft_p99_s, "itl_p99_s": objectives.itl_p99_s},
            "current_replicas": current, **_clean(result)}


def _clean(value):
    """NaN (no sample) as null: JSON has no NaN."""
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    return value


def plan_apply(*, deployment: Deployment, replicas: dict, actor, reason: str = "") -> list:
    """Scale each named pool to its planned replicas: one audited `scale` action per pool (pool_scale), all or
    none. 400 naming the role for a pool the deployment does not have (a plan of the other layout) or a number
    outside the pool's min..max."""
    if not isinstance(replicas, dict) or not replicas:
        raise invalid("replicas must be an object of role → replicas", field="replicas")
    pools = {pool.role: pool for pool in Pool.objects.filter(deployment=deployment)}
    for role, n in replicas.items():
        if role not in pools:
            raise invalid(f"deployment {deployment.name!r} runs {deployment.mode} pools ({sorted(pools)}), not a "
                          f"{role!r} pool: apply the {deployment.mode} plan", field=f"replicas.{role}", role=role)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise invalid(f"replicas for {role} must be a non-negative integer, not {n!r}",
                          field=f"replicas.{role}", role=role)
        pool = pools[role]
        if not pool.min_replicas <= n <= pool.max_replicas:
            raise invalid(f"planned replicas for {role} ({n}) are outside the pool's min..max "
                          f"({pool.min_replicas}..{pool.max_replicas})", field=f"replicas.{role}", role=role)
    reason = reason or "capacity plan"
    with transaction.atomic():
        return [pool_scale(deployment=deployment, role=role, replicas=n, actor=actor, reason=f"{reason} ({role})")
                for role, n in sorted(replicas.items())]


def requests_per_replica(*, pool: Pool, hours: float = 24.0, num_requests: int = 300) -> float:
    """What one replica of `pool` carries within the autoscaler's targets (the pool's own policy target, the other
    stage's default), from the current revision's profiles and the traffic shape of the last `hours`: the planner's
    capacity search with one replica in this pool and the other pool never the bottleneck. 400 without a profile or
    without traffic to take the shape from."""
    deployment = pool.deployment
    traffic = traffic_from_metrics(deployment=deployment, hours=hours)
    models = models_for(deployment, traffic)
    targets = {"ttft_p99_seconds": settings.TANDEM_AUTOSCALE_TTFT_TARGET_MS / 1000,
               "itl_p99_seconds": settings.TANDEM_AUTOSCALE_ITL_TARGET_MS / 1000}
    for metric, target in policy_targets(deployment):
        if metric in targets:
            targets[metric] = target
    objectives = Objectives(ttft_p99_s=targets["ttft_p99_seconds"], itl_p99_s=targets["itl_p99_seconds"])
    rate = replica_capacity_rps(pool.role, models=models, traffic=traffic, objectives=objectives,
                                num_requests=num_requests)
    if rate <= 0:
        raise invalid(f"one {pool.role} replica meets the autoscaler's targets at no rate of the observed traffic; "
                      f"give requests_per_replica", field="requests_per_replica", role=pool.role)
    return rate
