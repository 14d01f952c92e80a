"""Advisory rules: a rule with `advisory` on records each action that would change the fleet (every kind that does not
act on the alert itself, i.e. all but notify) as an ActionAdvice row instead of carrying it out, and an operator may
apply that advice, which carries it out through `alert_action_carry_out` as the operator's own action.

What an advice is:
- One row per firing and action. While the alert keeps firing each evaluation confirms it (`evaluated_at`,
  `num_evaluations`, the newest value); a firing whose target changed under it (the pool was scaled, the worker
  restarted, the deployment rolled to another revision) supersedes it with a new row. The alert resolving expires
  it; turning the rule's advisory switch off, disabling the rule or changing its actions supersedes every open
  advice of the rule (services.rules).
- The rule's cooldown applies as to actions: no new advice for a target within `cooldown_s` of the last one that was
  not withdrawn (open, applied or expired) or of an action carried out for it. A metric flapping around its
  threshold therefore leaves at most one row per cooldown per target.
- Applying one is refused with a 409 that says why when it is not open (applied, superseded: by what, expired),
  when its alert is no longer firing, when no evaluation confirmed it for FRESH_EVALUATIONS passes (the evaluator
  stopped, or a silence mutes the alert), when the target changed since it was advised, or when this firing's action
  already ran. Applied, it is the firing's run (a RuleActionRun, done): the firing does not advise again and the
  cooldown counts from it.
- At most KEPT_PER_RULE rows per rule are kept; an older row goes when a new one is written.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from controlplane.alerting.models import (ActionAdvice, ActionAdviceStatus, Alert, AlertRule, AlertState,
                                          RuleActionRun, RunStatus)
from controlplane.alerting.services import carry_out
from controlplane.alerting.services.action_kinds import (ALERT, DEPLOYMENT, POOL, WORKER, action_acts_on,
                                                         action_key)
from controlplane.errors import conflict, not_found
from controlplane.models import Pool
from controlplane.services.actions import action_find, as_actor

# The evaluator confirms open advice every TANDEM_ALERT_EVAL_INTERVAL_S; advice this many passes did not confirm is
# stale.
FRESH_EVALUATIONS = 12
KEPT_PER_RULE = 200
# Advice that is not withdrawn: what the cooldown counts.
_COUNTED = (ActionAdviceStatus.OPEN, ActionAdviceStatus.APPLIED, ActionAdviceStatus.EXPIRED)


def advises(rule: AlertRule, spec: dict) -> bool:
    """Whether the rule records this action as advice rather than carrying it out."""
    return rule.advisory and action_acts_on(spec) != ALERT


def target_basis(spec: dict, alert: Alert) -> tuple[dict | None, str]:
    """The state of the action's target that advice is made for, or (None, why the action would be skipped): the
    same checks as carry_out's, so that an advisory rule skips what an active one would."""
    acts_on = action_acts_on(spec)
    if alert.deployment_id is None:
        return None, "the alert has no deployment"
    if acts_on == POOL:
        pool = Pool.objects.filter(deployment_id=alert.deployment_id, role=alert.role).first()
        if pool is None:
            return None, f"deployment has no {alert.role!r} pool to {spec['type']}"
        return {"replicas": pool.desired_replicas}, ""
    if acts_on == WORKER:
        if alert.worker is None:
            return None, "the alert names no worker (or it no longer exists)"
        return {"worker": alert.worker.pk, "restart_count": alert.worker.restart_count}, ""
    if acts_on == DEPLOYMENT:
        return {"revision": alert.deployment.current_revision_id}, ""
    return {}, ""


def open_advice(*, deployment_name: str = "", limit: int = 100) -> list[ActionAdvice]:
    """The open advice of every rule (of one deployment), newest first: the alerts page's list."""
    rows = ActionAdvice.objects.filter(status=ActionAdviceStatus.OPEN).select_related("rule", "deployment", "alert")
    if deployment_name:
        rows = rows.filter(deployment__name=deployment_name)
    return list(rows.order_by("-created_at", "-id")[:limit])


def advice_confirm(*, rule: AlertRule, alert: Alert, index: int, spec: dict, target: str, detail: str, reason: str,
                   now: datetime) -> bool:
    """Confirm the open advice of this firing for `target` if it still holds, with the newest value and reason
    (returns True). Open advice of another firing, or made for a target that has changed since, is superseded
    (returns False: advise anew)."""
    current = ActionAdvice.objects.filter(rule=rule, action_index=index, target=target,
                                          status=ActionAdviceStatus.OPEN).first()
    if current is None:
        return False
    basis, _ = target_basis(spec, alert)
    if current.alert_id == alert.pk and current.basis == basis:
        return ActionAdvice.objects.filter(pk=current.pk, status=ActionAdviceStatus.OPEN).update(
            evaluated_at=now, num_evaluations=F("num_evaluations") + 1, value=alert.value, detail=detail[:2000],
            reason=reason[:4000]) == 1
    why = "another firing" if current.alert_id != alert.pk else f"its target changed ({current.basis} → {basis})"
    _settle(current.pk, ActionAdviceStatus.SUPERSEDED, now=now, outcome=f"superseded at {now.isoformat()}: {why}")
    return False


def advice_in_cooldown(rule: AlertRule, index: int, target: str, now: datetime) -> bool:
    if rule.cooldown_s == 0:
        return False
    return ActionAdvice.objects.filter(rule=rule, action_index=index, target=target, status__in=_COUNTED,
                                       created_at__gt=now - timedelta(seconds=rule.cooldown_s)).exists()


def advice_record(*, rule: AlertRule, alert: Alert, index: int, spec: dict, target: str, detail: str, reason: str,
                  now: datetime) -> str:
    """Record what the rule would do for this firing. Returns "" when recorded (or a concurrent pass recorded it),
    else why the action would have been skipped (no such pool or worker), for the caller's run row."""
    basis, missing = target_basis(spec, alert)
    if basis is None:
        return missing
    try:
        with transaction.atomic():
            ActionAdvice.objects.create(
                rule=rule, alert=alert, action_index=index, kind=spec["type"], params=spec, target=target,
                deployment_id=alert.deployment_id, role=alert.role, worker_id=alert.worker_id, basis=basis,
                value=alert.value, comparison=rule.comparison, threshold=rule.threshold, detail=detail[:2000],
                reason=reason[:4000], created_at=now, evaluated_at=now)
    except IntegrityError:
        return ""  # a concurrent pass recorded it first: one open advice per target
    _prune(rule)
    return ""


def advice_expire(*, alert: Alert, now: datetime) -> int:
    """The alert resolved: its open advice is no longer what the rule would do."""
    return ActionAdvice.objects.filter(alert=alert, status=ActionAdviceStatus.OPEN).update(
        status=ActionAdviceStatus.EXPIRED, settled_at=now, outcome=f"expired: the alert resolved at {now.isoformat()}")


def advice_withdraw(*, rule: AlertRule, outcome: str) -> int:
    """Supersede every open advice of the rule (it no longer advises those actions); returns how many."""
    return ActionAdvice.objects.filter(rule=rule, status=ActionAdviceStatus.OPEN).update(
        status=ActionAdviceStatus.SUPERSEDED, settled_at=timezone.now(), outcome=outcome[:4000])


def advice_apply(*, rule: AlertRule, advice_id: int, actor, reason: str = "",
                 idempotency_key: str | None = None):
    """Carry out the advice through alert_action_carry_out, the actor the operator and the reason naming the
    advice; returns (advice, action). 404 for advice of another rule, 409 for stale advice or an action the service
    would not carry out (see the module docstring). Repeated with the same idempotency key, it returns the first
    answer; without one, the advice's own key keeps it to one action.

    1. lock the advice; 2. check it is open, fresh, its alert firing, its target unchanged; 3. claim it (a
    conditional UPDATE); 4. carry it out; 5. record the firing's run, so that the cooldown counts from it.
    """
    advice = ActionAdvice.objects.filter(pk=advice_id, rule=rule).first()
    if advice is None:
        raise not_found(f"alert rule {rule.name!r} has no advice #{advice_id}")
    done = action_find(idempotency_key) if idempotency_key else None
    if done is not None and done.pk == advice.action_id:
        return advice, done
    actor = as_actor(actor)
    now = timezone.now()
    with transaction.atomic():
        # Only the advice row is locked: PostgreSQL refuses FOR UPDATE on the nullable side of an outer join.
        locked = ActionAdvice.objects.select_for_update(of=("self",)).select_related("rule", "alert", "deployment",
                                                                                     "worker")
        advice = locked.get(pk=advice.pk)
        alert = advice.alert
        _check_applicable(advice, alert, now=now)
        claimed = ActionAdvice.objects.filter(pk=advice.pk, status=ActionAdviceStatus.OPEN).update(
            status=ActionAdviceStatus.APPLIED, settled_at=now, applied_by=actor.name,
            outcome=f"applied by {actor.name}")
        if claimed != 1:
            raise conflict(f"advice #{advice.pk} was settled by another request first", advice=advice.pk)
        why = f"; {reason}" if reason else ""
        outcome = carry_out.alert_action_carry_out(
            kind=advice.kind, deployment=advice.deployment, actor=actor,
            reason=f"applied alert advice #{advice.pk}{why}: {advice.reason}"[:4000],
            idempotency_key=idempotency_key or f"alert-advice:{advice.pk}", params=advice.params, role=advice.role,
            worker=advice.worker, alert=alert, rule=rule, now=now)
        if outcome.status != carry_out.DONE:
            raise conflict(f"advice #{advice.pk} was not carried out: {outcome.detail}", advice=advice.pk)
        try:
            with transaction.atomic():
                RuleActionRun.objects.create(rule=rule, alert=alert, action_index=advice.action_index,
                                             kind=advice.kind, target=advice.target,
                                             idempotency_key=action_key(alert, advice.action_index),
                                             action=outcome.action, status=RunStatus.DONE, created_at=now)
        except IntegrityError:
            raise conflict(f"advice #{advice.pk} is stale: this firing's {advice.kind} already ran",
                           advice=advice.pk) from None
        ActionAdvice.objects.filter(pk=advice.pk).update(action=outcome.action)
    advice.refresh_from_db()
    return advice, outcome.action


def _check_applicable(advice: ActionAdvice, alert: Alert, *, now: datetime) -> None:
    if advice.status == ActionAdviceStatus.APPLIED:
        raise conflict(f"advice #{advice.pk} was already applied by {advice.applied_by} (action "
                       f"#{advice.action_id})", advice=advice.pk, action=advice.action_id)
    if advice.status != ActionAdviceStatus.OPEN:
        raise conflict(f"advice #{advice.pk} is stale: {advice.outcome}", advice=advice.pk)
    if not (advice.rule.advisory and advice.rule.enabled):
        # Switched in Django admin, which saves the rule without services.rules' withdrawal: the rule acts itself.
        raise conflict(f"advice #{advice.pk} is stale: rule {advice.rule.name!r} no longer advises (advisory off "
                       f"or disabled)", advice=advice.pk)
    if alert.state != AlertState.FIRING:
        raise conflict(f"advice #{advice.pk} is stale: its alert is {alert.state}", advice=advice.pk)
    fresh_s = FRESH_EVALUATIONS * settings.TANDEM_ALERT_EVAL_INTERVAL_S
    if advice.evaluated_at < now - timedelta(seconds=fresh_s):
        raise conflict(f"advice #{advice.pk} is stale: no evaluation confirmed it since "
                       f"{advice.evaluated_at.isoformat()} (more than {fresh_s:g} s ago)", advice=advice.pk)
    basis, missing = target_basis(advice.params, alert)
    if basis != advice.basis:
        now_is = missing or ", ".join(f"{name} {value}" for name, value in basis.items())
        was = ", ".join(f"{name} {value}" for name, value in advice.basis.items())
        raise conflict(f"advice #{advice.pk} is stale: its target changed since it was advised ({was}; now: "
                       f"{now_is})", advice=advice.pk, basis=basis)
    if RuleActionRun.objects.filter(idempotency_key=action_key(alert, advice.action_index)).exists():
        raise conflict(f"advice #{advice.pk} is stale: this firing's {advice.kind} already ran", advice=advice.pk)


def _settle(pk: int, status: str, *, now: datetime, outcome: str) -> None:
    ActionAdvice.objects.filter(pk=pk, status=ActionAdviceStatus.OPEN).update(status=status, settled_at=now,
                                                                               outcome=outcome[:4000])


def _prune(rule: AlertRule) -> None:
    oldest_kept = list(ActionAdvice.objects.filter(rule=rule).order_by("-id")
                       .values_list("id", flat=True)[KEPT_PER_RULE - 1:KEPT_PER_RULE])
    if oldest_kept:
        ActionAdvice.objects.filter(rule=rule, id__lt=oldest_kept[0]).delete()
