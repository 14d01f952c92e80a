"""The bounds the autoscaler works within for a pool at an instant (`pool_bounds`):

1. the pool's own min..max;
2. the active schedule windows: the highest floor and the lowest ceiling among them (a floor above a ceiling: the
   floor wins, an operator who asked for capacity gets it), clamped into the pool's own bounds;
3. a predictive floor where the pool has it on: ceil(forecast rate / requests per replica), never above the
   ceiling of step 2 (the ceiling is the operator's cost limit). The floor and forecast are kept on the pool's
   predictive settings, for the API to show.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from controlplane.capacity.models import PoolSchedule, PredictiveScaling
from controlplane.capacity.selectors import schedule_window
from controlplane.models import DeploymentMode, Pool
from controlplane.observability.reader import reader

DAY_S = 86400


@dataclass(frozen=True, slots=True)
class PoolBounds:
    min_replicas: int
    max_replicas: int
    why: str  # "" when the pool's own bounds apply


def forecast_rps(pool: Pool, *, now: datetime, lead_time_s: int, history_days: int) -> float | None:
    """The request rate the pool will see within the next `lead_time_s`: for each of the previous days, the highest
    rate between the same time of day and lead_time_s later; their mean. None without any history. Raises
    MetricsUnavailable when the metrics backend does not answer (the autoscaler then holds still)."""
    entry_role = pool.role
    if pool.deployment.mode == DeploymentMode.DISAGGREGATED and pool.role == "decode":
        entry_role = "prefill"  # decode pools count the requests the prefill pool hands them; same rate
    peaks = []
    window = max(lead_time_s, 60)
    for day in range(1, history_days + 1):
        # (now − day, now − day + lead]: what that day did over the next lead time (rollups, past raw retention).
        values = reader().metric_values(metric="qps", deployment=pool.deployment_id, role=entry_role,
                                        aggregation="max", window_s=window, offset_s=day * DAY_S - window, now=now)
        if values and values[0].value is not None:
            peaks.append(values[0].value)
    if not peaks:
        return None
    return sum(peaks) / len(peaks)


def pool_bounds(pools, *, now: datetime | None = None) -> dict[int, PoolBounds]:
    """The bounds of each pool at `now` (see the module docstring); one query for schedules and one for predictive
    settings, plus one series read per day of history of each pool that has predictive scaling on."""
    now = now or timezone.now()
    pools = list(pools)
    schedules: dict[int, list[PoolSchedule]] = {}
    for schedule in PoolSchedule.objects.filter(pool__in=[p.pk for p in pools], enabled=True):
        schedules.setdefault(schedule.pool_id, []).append(schedule)
    predictive = {p.pool_id: p for p in PredictiveScaling.objects.filter(pool__in=[p.pk for p in pools],
                                                                          enabled=True)}
    bounds, updates = {}, []
    for pool in pools:
        low, high, why = pool.min_replicas, pool.max_replicas, []
        active = [s for s in schedules.get(pool.pk, []) if schedule_window(s).is_active(now)]
        floors = [s.min_replicas for s in active if s.min_replicas is not None]
        ceilings = [s.max_replicas for s in active if s.max_replicas is not None]
        if ceilings:
            high = max(low, min(high, min(ceilings)))
        if floors:
            low = min(max(low, max(floors)), pool.max_replicas)
            high = max(high, low)
        if active:
            why.append("schedule " + ", ".join(repr(s.name) for s in active))
        policy = predictive.get(pool.pk)
        if policy is not None and policy.requests_per_replica:
            rate = forecast_rps(pool, now=now, lead_time_s=policy.lead_time_s, history_days=policy.history_days)
            floor = None if rate is None else min(high, max(low, math.ceil(rate / policy.requests_per_replica - 1e-9)))
            if floor is not None and floor > low:
                why.append(f"predictive floor {floor} (forecast {rate:.3g} req/s within {policy.lead_time_s}s at "
                           f"{policy.requests_per_replica:g} req/s per replica)")
                low = floor
            policy.last_floor, policy.last_forecast_rps = floor, rate
            updates.append(policy)
        bounds[pool.pk] = PoolBounds(low, high, "; ".join(why))
    if updates:
        PredictiveScaling.objects.bulk_update(updates, ["last_floor", "last_forecast_rps"])
    return bounds
