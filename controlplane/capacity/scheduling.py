"""Per-pool schedules and predictive floors: their writes (audited as `autoscale` actions, like every change to
how the autoscaler sizes a pool) and the bounds the autoscaler works within at an instant (`pool_bounds`).

The bounds at an instant:
1. the pool's own min..max;
2. the active schedule windows: the highest floor and the lowest ceiling among them (a floor above a ceiling: the
   floor wins, an operator who asked for capacity gets it), clamped into the pool's own bounds;
3. a predictive floor where the pool has it on: ceil(forecast rate / requests per replica), never above the
   ceiling of step 2 (the ceiling is the operator's cost limit).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.capacity.models import PoolSchedule, PredictiveScaling
from controlplane.capacity.windows import Window, WindowError
from controlplane.capacity.planning import requests_per_replica as per_replica_capacity
from controlplane.errors import ControlPlaneError, invalid, not_found
from controlplane.models import ActionKind, ActionStatus, DeploymentMode, Pool
from controlplane.observability.series import metric_values
from controlplane.services.actions import action_create, as_actor

DAY_S = 86400


@dataclass(frozen=True, slots=True)
class PoolBounds:
    min_replicas: int
    max_replicas: int
    why: str  # "" when the pool's own bounds apply


def _window_of(schedule: PoolSchedule) -> Window:
    return Window(schedule.cron, schedule.duration_minutes, schedule.timezone)


def schedule_validate(*, pool: Pool, data: dict, partial: bool = False, instance: PoolSchedule | None = None) -> dict:
    """{name, cron, duration_minutes, timezone, min_replicas, max_replicas, enabled} → checked; 400 naming the
    field (and the role where the bounds are the pool's)."""
    known = {"name", "cron", "duration_minutes", "timezone", "min_replicas", "max_replicas", "enabled"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise invalid(f"unknown schedule fields {unknown} (known: {sorted(known)})", field=unknown[0])
    merged = {"timezone": "UTC", "min_replicas": None, "max_replicas": None, "enabled": True}
    if instance is not None:
        merged.update({f: getattr(instance, f) for f in known})
    merged.update(data)
    for required in ("name", "cron", "duration_minutes"):
        if merged.get(required) in (None, ""):
            raise invalid(f"{required} is required", field=required)
    if not isinstance(merged["name"], str) or len(merged["name"]) > 100:
        raise invalid("name must be a string of at most 100 characters", field="name")
    if not isinstance(merged["cron"], str):
        raise invalid("cron must be a string", field="cron")
    try:
        Window(merged["cron"], merged["duration_minutes"], merged["timezone"])
    except WindowError as exc:
        raise invalid(str(exc), field=exc.field) from None
    for bound in ("min_replicas", "max_replicas"):
        value = merged[bound]
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise invalid(f"{bound} must be an integer or null, not {value!r}", field=bound)
        if not pool.min_replicas <= value <= pool.max_replicas:
            raise invalid(f"{bound} for {pool.role} must be within the pool's own bounds "
                          f"{pool.min_replicas}..{pool.max_replicas}, not {value}", field=bound, role=pool.role)
    if merged["min_replicas"] is None and merged["max_replicas"] is None:
        raise invalid("a schedule needs min_replicas, max_replicas or both", field="min_replicas")
    if merged["min_replicas"] is not None and merged["max_replicas"] is not None and \
            merged["min_replicas"] > merged["max_replicas"]:
        raise invalid(f"min_replicas ({merged['min_replicas']}) is above max_replicas ({merged['max_replicas']})",
                      field="min_replicas", role=pool.role)
    if not isinstance(merged["enabled"], bool):
        raise invalid("enabled must be true or false", field="enabled")
    return {f: merged[f] for f in known}


def _audit(pool: Pool, actor, reason: str, params: dict) -> None:
    action_create(kind=ActionKind.AUTOSCALE, actor=as_actor(actor), deployment=pool.deployment, reason=reason,
                  status=ActionStatus.SUCCEEDED, params={"role": pool.role, **params})


def _as_dict(schedule: PoolSchedule) -> dict:
    return {f: getattr(schedule, f) for f in ("name", "cron", "duration_minutes", "timezone", "min_replicas",
                                             "max_replicas", "enabled")}


def schedule_create(*, pool: Pool, actor, **data) -> PoolSchedule:
    fields = schedule_validate(pool=pool, data=data)
    try:
        with transaction.atomic():
            schedule = PoolSchedule.objects.create(pool=pool, **fields)
            _audit(pool, actor, f"{pool.role} pool: schedule {schedule.name!r} created",
                   {"schedule": schedule.pk, "to": fields})
    except IntegrityError:
        raise invalid(f"the {pool.role} pool already has a schedule named {fields['name']!r}", field="name",
                      role=pool.role) from None
    return schedule


def schedule_update(*, schedule: PoolSchedule, actor, **data) -> PoolSchedule:
    pool = schedule.pool
    fields = schedule_validate(pool=pool, data=data, instance=schedule)
    before = _as_dict(schedule)
    try:
        with transaction.atomic():
            for field, value in fields.items():
                setattr(schedule, field, value)
            schedule.save()
            _audit(pool, actor, f"{pool.role} pool: schedule {schedule.name!r} changed",
                   {"schedule": schedule.pk, "from": before, "to": fields})
    except IntegrityError:
        raise invalid(f"the {pool.role} pool already has a schedule named {fields['name']!r}", field="name",
                      role=pool.role) from None
    return schedule


def schedule_delete(*, schedule: PoolSchedule, actor) -> None:
    pool = schedule.pool
    with transaction.atomic():
        _audit(pool, actor, f"{pool.role} pool: schedule {schedule.name!r} deleted",
               {"schedule": schedule.pk, "from": _as_dict(schedule)})
        schedule.delete()


def schedule_get(*, deployment, schedule_id: int) -> PoolSchedule:
    schedule = PoolSchedule.objects.select_related("pool__deployment").filter(
        pk=schedule_id, pool__deployment=deployment).first()
    if schedule is None:
        raise not_found(f"deployment {deployment.name!r} has no schedule #{schedule_id}")
    return schedule


def pool_of(deployment, role) -> Pool:
    if not isinstance(role, str):
        raise invalid("role is required", field="role")
    pool = Pool.objects.select_related("deployment").filter(deployment=deployment, role=role).first()
    if pool is None:
        roles = sorted(deployment.pools.values_list("role", flat=True))
        raise invalid(f"deployment {deployment.name!r} has no {role!r} pool (its pools: {roles})", field="role",
                      role=role)
    return pool


def predictive_set(*, pool: Pool, actor, enabled: bool | None = None, lead_time_s: int | None = None,
                   history_days: int | None = None, requests_per_replica: float | None = None) -> PredictiveScaling:
    """Turn a pool's predictive floor on or off, or change its lead time, history or per-replica rate; audited."""
    if enabled is not None and not isinstance(enabled, bool):
        raise invalid("enabled must be true or false", field="enabled")
    if lead_time_s is not None and (isinstance(lead_time_s, bool) or not isinstance(lead_time_s, int)
                                    or not 0 <= lead_time_s <= DAY_S):
        raise invalid(f"lead_time_s must be an integer 0..{DAY_S}", field="lead_time_s")
    if history_days is not None and (isinstance(history_days, bool) or not isinstance(history_days, int)
                                     or not 1 <= history_days <= 28):
        raise invalid("history_days must be an integer 1..28", field="history_days")
    if requests_per_replica is not None and (isinstance(requests_per_replica, bool)
                                             or not isinstance(requests_per_replica, (int, float))
                                             or not requests_per_replica > 0):
        raise invalid("requests_per_replica must be a number > 0", field="requests_per_replica")
    with transaction.atomic():
        policy, _ = PredictiveScaling.objects.select_for_update().get_or_create(pool=pool)
        before = {"enabled": policy.enabled, "lead_time_s": policy.lead_time_s, "history_days": policy.history_days,
                  "requests_per_replica": policy.requests_per_replica}
        for field, value in (("enabled", enabled), ("lead_time_s", lead_time_s), ("history_days", history_days),
                             ("requests_per_replica", requests_per_replica)):
            if value is not None:
                setattr(policy, field, float(value) if field == "requests_per_replica" else value)
        if policy.enabled and not policy.requests_per_replica:
            # From the profile: what one replica carries within the autoscaler's targets at the observed traffic.
            try:
                policy.requests_per_replica = per_replica_capacity(pool=pool)
            except ControlPlaneError as exc:
                raise invalid(f"predictive scaling of the {pool.role} pool needs requests_per_replica (what one "
                              f"replica carries within the objectives), and it cannot be computed: {exc.message}",
                              field="requests_per_replica", role=pool.role) from None
        policy.updated_at = timezone.now()
        policy.save()
        after = {"enabled": policy.enabled, "lead_time_s": policy.lead_time_s, "history_days": policy.history_days,
                 "requests_per_replica": policy.requests_per_replica}
        _audit(pool, actor, f"{pool.role} pool: predictive scaling {'on' if policy.enabled else 'off'}, lead "
                            f"{policy.lead_time_s}s", {"predictive": True, "from": before, "to": after})
    return policy


def forecast_rps(pool: Pool, *, now: datetime, lead_time_s: int, history_days: int) -> float | None:
    """The request rate the pool will see within the next `lead_time_s`: for each of the previous days, the highest
    rate between the same time of day and lead_time_s later; their mean. None without any history."""
    entry_role = pool.role
    if pool.deployment.mode == DeploymentMode.DISAGGREGATED and pool.role == "decode":
        entry_role = "prefill"  # decode pools count the requests the prefill pool hands them; same rate
    peaks = []
    window = max(lead_time_s, 60)
    for day in range(1, history_days + 1):
        # (now − day, now − day + lead]: what that day did over the next lead time (rollups, past raw retention).
        values = metric_values(metric="qps", deployment=pool.deployment_id, role=entry_role, aggregation="max",
                               window_s=window, offset_s=day * DAY_S - window, now=now)
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
        active = [s for s in schedules.get(pool.pk, []) if _window_of(s).is_active(now)]
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


def schedules_view(pool: Pool, *, now: datetime | None = None) -> list[dict]:
    """A pool's schedules with whether each is active now and when it next starts (the deployment page, the API)."""
    now = now or timezone.now()
    rows = []
    for schedule in pool.schedules.order_by("name"):
        window = _window_of(schedule)
        rows.append({"id": schedule.pk, "role": pool.role, **_as_dict(schedule),
                     "active": schedule.enabled and window.is_active(now),
                     "active_until": window.active_until(now) if schedule.enabled else None,
                     "next_start": window.next_start(now)})
    return rows
