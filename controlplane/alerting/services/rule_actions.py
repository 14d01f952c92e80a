"""What a firing rule does, through the core services so that each is an Action row with the rule as actor.

Once per firing: the idempotency key is (rule id, fingerprint, firing start, action index); the same key goes to
the core service, so even two evaluators racing produce one Action. Cooldown: an action runs only when the same
action of the same rule did not run for the same target within `cooldown_s` — a metric that flaps around its
threshold therefore causes at most one action per target per cooldown. Mass restarts: a restart is held (the run
recorded as skipped, with why) while rules on the same metric are pending or firing for a large share of the fleet's
workers at once (_mass_restart). Advisory rules record the actions that change the fleet as advice instead
(services.advice); their notifications go as usual.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import IntegrityError

from controlplane.alerting.models import Alert, AlertRule, RuleActionRun, RunStatus
from controlplane.alerting.services import carry_out
from controlplane.alerting.services.action_kinds import (ALERT, ALERT_ACTIONS, WORKER, action_acts_on, action_key,
                                                         action_target)
from controlplane.alerting.services.advice import advice_confirm, advice_in_cooldown, advice_record, advises
from controlplane.services import Actor

log = logging.getLogger(__name__)


def in_cooldown(rule: AlertRule, index: int, target: str, now: datetime) -> bool:
    if rule.cooldown_s == 0:
        return False
    since = now - timedelta(seconds=rule.cooldown_s)
    return RuleActionRun.objects.filter(rule=rule, action_index=index, target=target, created_at__gt=since,
                                        status=RunStatus.DONE).exists()


def reason_for(rule: AlertRule, alert: Alert, detail: str) -> str:
    where = f"{alert.labels.get('deployment', '')}/{alert.role or 'all'}"
    if alert.worker_id is not None:
        where += f" worker {alert.worker_id}"
    return (f"alert rule {rule.name!r} firing on {where}: {detail} {rule.comparison} {rule.threshold:g}"
            f" (for {rule.for_s}s)")


def alert_act(*, alert: Alert, rule: AlertRule, detail: str, now: datetime, deliver=None) -> int:
    """Run each of the rule's actions for this firing that has not run yet and is not in cooldown.
    Returns the number of actions carried out (done or failed). `deliver`: how a notify action's deliveries are
    sent (notifications.notify; default: by Celery)."""
    num_run = 0
    for index, spec in enumerate(rule.actions or []):
        key = action_key(alert, index)
        if RuleActionRun.objects.filter(idempotency_key=key).exists():
            continue
        target = action_target(spec, alert)
        advising, reason = advises(rule, spec), reason_for(rule, alert, detail)
        # The open advice of this firing is confirmed before the cooldown is read: its own row is within it.
        if advising and advice_confirm(rule=rule, alert=alert, index=index, spec=spec, target=target,
                                       detail=detail, reason=reason, now=now):
            continue
        if in_cooldown(rule, index, target, now) or (advising and advice_in_cooldown(rule, index, target, now)):
            continue
        held = _mass_restart(rule, alert) if action_acts_on(spec) == WORKER else None
        if held is not None:
            status, action, error = RunStatus.SKIPPED, None, held
            log.warning("rule %s: restart of worker %s held: %s", rule.name, alert.worker_id, held)
        elif advising:
            error = advice_record(rule=rule, alert=alert, index=index, spec=spec, target=target, detail=detail,
                                  reason=reason, now=now)
            if not error:
                continue  # advised, not run: no run row, so later passes confirm it
            status, action = RunStatus.SKIPPED, None
        else:
            status, action, error = _perform(spec, alert=alert, rule=rule, reason=reason, key=key, event="firing",
                                             now=now, deliver=deliver)
        try:
            RuleActionRun.objects.create(rule=rule, alert=alert, action_index=index, kind=spec["type"],
                                         target=target, idempotency_key=key, action=action, status=status,
                                         error=error, created_at=now)
        except IntegrityError:
            continue  # a concurrent pass recorded it; the core service's idempotency key kept it to one Action
        num_run += 1
    return num_run


def alert_notify_resolved(*, alert: Alert, rule: AlertRule, now: datetime, deliver=None) -> int:
    """Send "resolved" to the channels that were told about this firing."""
    num_run = 0
    for index, spec in enumerate(rule.actions or []):
        kind = ALERT_ACTIONS.get(spec["type"])
        if kind is None or not kind.on_resolved:
            continue
        fired = RuleActionRun.objects.filter(idempotency_key=action_key(alert, index), status=RunStatus.DONE)
        key = action_key(alert, index, "resolved")
        if not fired.exists() or RuleActionRun.objects.filter(idempotency_key=key).exists():
            continue
        reason = f"alert rule {rule.name!r} resolved on {alert.labels.get('deployment', '')}/{alert.role or 'all'}"
        status, action, error = _perform(spec, alert=alert, rule=rule, reason=reason, key=key, event="resolved",
                                         now=now, deliver=deliver)
        try:
            RuleActionRun.objects.create(rule=rule, alert=alert, action_index=index, kind=spec["type"],
                                         target=action_target(spec, alert), idempotency_key=key, action=action,
                                         status=status, error=error, created_at=now)
        except IntegrityError:
            continue
        num_run += 1
    return num_run


def _mass_restart(rule: AlertRule, alert: Alert) -> str | None:
    """Why a rule's restart of one worker is held, or None: the rules on the same metric are pending or firing for
    so many workers of the fleet at once (supervision.probe_hold's threshold over the ready workers) that the
    metric's source (a scraper or Prometheus that cannot keep up, its network) is the likely cause, not the workers.
    On the 1,000-worker bench every worker's `up` read 0 for 30 s at once and the default worker-down rules began
    restarting the whole fleet, deployment after deployment. The notify actions still go; the health pass still
    restarts a worker that is really gone."""
    if alert.worker_id is None:
        return None
    from controlplane.alerting.models import ACTIVE_STATES
    from controlplane.models import Worker, WorkerStatus
    from controlplane.supervision.probe_hold import hold_threshold

    num_active = Alert.objects.filter(state__in=ACTIVE_STATES, worker__isnull=False, rule__metric=rule.metric,
                                      rule__enabled=True).values("worker_id").distinct().count()
    num_ready = Worker.objects.filter(status=WorkerStatus.READY).count()
    if num_active < hold_threshold(num_ready):
        return None
    return (f"held: rules on {rule.metric} are pending or firing for {num_active} workers at once ({num_ready} "
            f"ready): the metric's source is the likely cause, not the workers (TANDEM_HEALTH_HOLD_PCT, "
            f"TANDEM_HEALTH_HOLD_MIN)")


_RUN_STATUS = {carry_out.DONE: RunStatus.DONE, carry_out.SKIPPED: RunStatus.SKIPPED,
               carry_out.REFUSED: RunStatus.FAILED}


def _perform(spec: dict, *, alert: Alert, rule: AlertRule, reason: str, key: str, event: str, now: datetime,
             deliver=None):
    """→ (RunStatus, Action or None, error text)."""
    kind = spec["type"]
    if alert.deployment is None and action_acts_on(spec) != ALERT:
        return RunStatus.SKIPPED, None, "the alert has no deployment"
    outcome = carry_out.alert_action_carry_out(kind=kind, deployment=alert.deployment, actor=Actor.rule(rule.name),
                                               reason=reason, idempotency_key=key, params=spec, role=alert.role,
                                               worker=alert.worker, alert=alert, rule=rule, event=event, now=now,
                                               deliver=deliver)
    return _RUN_STATUS[outcome.status], outcome.action, outcome.detail
