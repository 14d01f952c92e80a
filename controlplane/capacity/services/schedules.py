"""Writes of per-pool schedules and predictive floors, each audited as an `autoscale` action like every change to
how the autoscaler sizes a pool. What the bounds are at an instant is bounds.pool_bounds."""
from __future__ import annotations

from django.db import IntegrityError, transaction
from django.utils import timezone

from controlplane.capacity.models import PoolSchedule, PredictiveScaling
from controlplane.capacity.selectors import SCHEDULE_FIELDS, schedule_fields
from controlplane.capacity.services.plans import requests_per_replica as per_replica_capacity
from controlplane.capacity.sizing.windows import Window, WindowError
from controlplane.errors import ControlPlaneError, invalid
from controlplane.models import ActionKind, ActionStatus, Pool
from controlplane.services.actions import action_create, as_actor

DAY_S = 86400


def schedule_validate(*, pool: Pool, data: dict, partial: bool = False, instance: PoolSchedule | None = None) -> dict:
    """{name, cron, duration_minutes, timezone, min_replicas, max_replicas, enabled} → checked; 400 naming the
    field (and the role where the bounds are the pool's)."""
    known = set(SCHEDULE_FIELDS)
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
    before = schedule_fields(schedule)
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
               {"schedule": schedule.pk, "from": schedule_fields(schedule)})
        schedule.delete()


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
