"""Advisory mode: the autoscaler records the scale it would make as a ScaleAdvice row instead of making it, and an
operator may apply that advice, which scales the pool through `pool_scale` as the operator's own action.

What an advice is:
- At most one open advice per pool. An evaluation that decides the same scale of the same size confirms it
  (`evaluated_at`, `num_evaluations`, its newest numbers); one that decides another size supersedes it with a new
  row; one that keeps the size supersedes it with none. Switching the deployment back to active, or the autoscaler
  off, supersedes every open advice of the deployment (services.autoscaling_update).
- Applying one is refused with a 409 that says why when it is not open (applied, or superseded: by what), when no
  evaluation confirmed it for FRESH_EVALUATIONS passes (the autoscaler stopped evaluating the pool: paused, its
  metrics gone), when the pool's desired replicas are no longer its `from` (someone scaled it since), or when it
  would pass the deployment's budget (budget.py).
- A scale that carried out an advice counts as the autoscaler's own (autoscaler.load_inputs reads `action` here):
  it does not pause the autoscaler as a manual scale does, and the step cap counts from it, so that advice applied
  as it comes grows a pool no faster than the active autoscaler would.
- At most KEPT_PER_POOL rows per pool are kept; an older row goes when a new one is written.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.autoscaling.budget import budget_check
from controlplane.autoscaling.hpa import Decision
from controlplane.autoscaling.models import AdviceStatus, ScaleAdvice
from controlplane.errors import conflict, not_found
from controlplane.models import ActionKind, Pool
from controlplane.services import pool_scale
from controlplane.services.actions import action_find, as_actor

# An evaluation runs every TANDEM_SCRAPE_INTERVAL_S; advice that this many passes did not confirm is stale.
FRESH_EVALUATIONS = 12
KEPT_PER_POOL = 200


def open_advice(pool_ids) -> dict[int, ScaleAdvice]:
    """pool id → its open advice, for the pools that have one (one query for a whole pass)."""
    return {row.pool_id: row for row in ScaleAdvice.objects.filter(pool__in=list(pool_ids),
                                                                   status=AdviceStatus.OPEN)}


def advised_action_ids(deployment_ids, *, since: datetime) -> set[int]:
    """The scale actions since `since` that carried out an advice of these deployments' pools."""
    return set(ScaleAdvice.objects.filter(pool__deployment_id__in=list(deployment_ids), action__isnull=False,
                                          settled_at__gt=since).values_list("action_id", flat=True))


def advice_record(*, pool, decision: Decision, current: ScaleAdvice | None, numbers: dict,
                  now: datetime) -> ScaleAdvice:
    """Record what an advisory evaluation decided for `pool`: confirm the open advice `current` when it is the same
    scale, else supersede it with a new row. `numbers`: metric, observed, target, ratio and the other inputs."""
    fields = {"metric": numbers["metric"], "observed": numbers["observed"], "target": numbers["target"],
              "ratio": numbers["ratio"], "raw": decision.raw, "inputs": numbers["inputs"],
              "reason": decision.reason[:4000]}
    same = current is not None and (current.from_replicas, current.to_replicas) == (decision.current,
                                                                                  decision.desired)
    if same and ScaleAdvice.objects.filter(pk=current.pk, status=AdviceStatus.OPEN).update(
            evaluated_at=now, num_evaluations=F("num_evaluations") + 1, **fields):
        current.refresh_from_db()
        return current
    with transaction.atomic():
        row = ScaleAdvice.objects.create(pool=pool, from_replicas=decision.current, to_replicas=decision.desired,
                                         created_at=now, evaluated_at=now, **fields)
        if current is not None:
            _supersede(current.pk, now=now, outcome=f"superseded by advice #{row.pk} ({row.from_replicas} → "
                                                    f"{row.to_replicas})")
    _prune(pool)
    return row


def advice_settle(*, current: ScaleAdvice | None, decision: Decision, now: datetime) -> None:
    """An advisory evaluation that keeps the pool's size supersedes its open advice: it is no longer what the
    autoscaler would do."""
    if current is not None:
        _supersede(current.pk, now=now, outcome=f"superseded at {now.isoformat()}: the autoscaler now keeps "
                                                f"{decision.current} ({decision.reason[:300]})")


def advice_supersede_all(*, deployment, outcome: str) -> int:
    """Supersede every open advice of the deployment (its autoscaler stopped advising); returns how many."""
    return ScaleAdvice.objects.filter(pool__deployment=deployment, status=AdviceStatus.OPEN).update(
        status=AdviceStatus.SUPERSEDED, settled_at=timezone.now(), outcome=outcome)


def advice_apply(*, deployment, advice_id: int, actor, reason: str = "", idempotency_key: str | None = None):
    """Scale the advice's pool to its `to` through pool_scale, the actor the operator and the reason naming the
    advice; returns (advice, the scale action). 404 for advice of another deployment, 409 for stale advice (see
    the module docstring). Repeated with the same idempotency key, it returns the first answer.

    1. lock the pool; 2. check the advice is open, fresh, made for the pool's size now, within the budget;
    3. claim it (a conditional UPDATE: two operators clicking at once apply it once); 4. pool_scale.
    """
    advice = ScaleAdvice.objects.select_related("pool").filter(pk=advice_id, pool__deployment=deployment).first()
    if advice is None:
        raise not_found(f"deployment {deployment.name!r} has no autoscaler advice #{advice_id}")
    done = action_find(idempotency_key, kind=ActionKind.SCALE) if idempotency_key else None
    if done is not None and done.pk == advice.action_id:
        return advice, done
    actor = as_actor(actor)
    now = timezone.now()
    with transaction.atomic():
        pool = Pool.objects.select_for_update().get(pk=advice.pool_id)
        advice.refresh_from_db()
        _check_applicable(advice, pool, now=now)
        budget_check(deployment, role=pool.role, current=pool.desired_replicas, replicas=advice.to_replicas,
                     floor=pool.min_replicas)
        claimed = ScaleAdvice.objects.filter(pk=advice.pk, status=AdviceStatus.OPEN).update(
            status=AdviceStatus.APPLIED, settled_at=now, applied_by=actor.name,
            outcome=f"applied by {actor.name}")
        if claimed != 1:
            raise conflict(f"advice #{advice.pk} was settled by another request first", advice=advice.pk)
        why = f"; {reason}" if reason else ""
        action = pool_scale(deployment=deployment, role=pool.role, replicas=advice.to_replicas, actor=actor,
                            reason=f"applied autoscaler advice #{advice.pk}{why}: {advice.reason}"[:4000],
                            idempotency_key=idempotency_key)
        ScaleAdvice.objects.filter(pk=advice.pk).update(action=action)
    advice.refresh_from_db()
    return advice, action


def _check_applicable(advice: ScaleAdvice, pool, *, now: datetime) -> None:
    if advice.status == AdviceStatus.APPLIED:
        raise conflict(f"advice #{advice.pk} was already applied by {advice.applied_by} (action "
                       f"#{advice.action_id})", advice=advice.pk, action=advice.action_id)
    if advice.status == AdviceStatus.SUPERSEDED:
        raise conflict(f"advice #{advice.pk} is stale: {advice.outcome}", advice=advice.pk)
    fresh_s = FRESH_EVALUATIONS * settings.TANDEM_SCRAPE_INTERVAL_S
    if advice.evaluated_at < now - timedelta(seconds=fresh_s):
        raise conflict(f"advice #{advice.pk} is stale: no evaluation confirmed it since "
                       f"{advice.evaluated_at.isoformat()} (more than {fresh_s:g} s ago)", advice=advice.pk)
    if pool.desired_replicas != advice.from_replicas:
        raise conflict(f"advice #{advice.pk} is stale: it scales {pool.role} from {advice.from_replicas}, and the "
                       f"pool has {pool.desired_replicas} desired replicas now", advice=advice.pk,
                       replicas=pool.desired_replicas)


def _supersede(pk: int, *, now: datetime, outcome: str) -> None:
    ScaleAdvice.objects.filter(pk=pk, status=AdviceStatus.OPEN).update(
        status=AdviceStatus.SUPERSEDED, settled_at=now, outcome=outcome[:4000])


def _prune(pool) -> None:
    oldest_kept = list(ScaleAdvice.objects.filter(pool=pool).order_by("-id")
                       .values_list("id", flat=True)[KEPT_PER_POOL - 1:KEPT_PER_POOL])
    if oldest_kept:
        ScaleAdvice.objects.filter(pool=pool, id__lt=oldest_kept[0]).delete()
