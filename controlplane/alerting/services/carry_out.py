"""From an alert's action to a core service call: one dispatcher for alert rules and Alertmanager webhooks alike.

Each call is an Action row with the rule or the webhook sender as actor, under the caller's idempotency key, so a
firing delivered or evaluated twice acts once. A refusal by the service (a rollout in progress, no earlier
revision, a pool at its bound) is an outcome to record, never an exception.
"""
from __future__ import annotations

import logging
from datetime import datetime

from controlplane.alerting.models import Alert, AlertRule
from controlplane.alerting.services.action_kinds import (
    ALERT_ACTIONS, DONE, POOL, REFUSED, SKIPPED, WORKER, Call, Outcome, action_params,
)
from controlplane.errors import ControlPlaneError
from controlplane.models import Deployment, Pool, Worker
from controlplane.services import PoolAtBound

log = logging.getLogger(__name__)

__all__ = ["DONE", "REFUSED", "SKIPPED", "Outcome", "alert_action_carry_out"]


def alert_action_carry_out(*, kind: str, deployment: Deployment | None, actor, reason: str, idempotency_key: str,
                           params: dict | None = None, role: str = "", worker: Worker | None = None,
                           alert: Alert | None = None, rule: AlertRule | None = None, event: str = "firing",
                           now: datetime | None = None, deliver=None) -> Outcome:
    """Carry out one action of `kind` (action_kinds.ALERT_ACTIONS) with `params` (a rule's entry, or what an
    Alertmanager alert asked; missing ones take their defaults) through its service, on the `role` pool, the
    `worker` or the `deployment` as the kind acts on. `alert`, `rule`, `event`, `now`, `deliver`: a rule's firing,
    for the kinds that tell people about it."""
    action_kind = ALERT_ACTIONS.get(kind)
    if action_kind is None:
        return Outcome(REFUSED, detail=f"unknown action type {kind!r} (one of {', '.join(ALERT_ACTIONS)})")
    try:
        if action_kind.acts_on == POOL and not Pool.objects.filter(deployment=deployment, role=role).exists():
            return Outcome(SKIPPED, detail=f"deployment has no {role!r} pool to {kind}")
        if action_kind.acts_on == WORKER and worker is None:
            return Outcome(SKIPPED, detail="the alert names no worker (or it no longer exists)")
        action = action_kind.run(Call(deployment=deployment, actor=actor, reason=reason,
                                      idempotency_key=idempotency_key,
                                      params=action_params(action_kind, params or {}), role=role, worker=worker,
                                      alert=alert, rule=rule, event=event, now=now, deliver=deliver))
    except PoolAtBound as exc:
        return Outcome(SKIPPED, detail=exc.message)
    except ControlPlaneError as exc:
        log.warning("%s: %s refused: %s", getattr(actor, "name", actor), kind, exc.message)
        return Outcome(REFUSED, detail=exc.message)
    return Outcome(DONE, action)
