"""From an alert's action to a core service call: one dispatcher for alert rules and Alertmanager webhooks alike.

Each call is an Action row with the rule or the webhook sender as actor, under the caller's idempotency key, so a
firing delivered or evaluated twice acts once. A refusal by the service (a rollout in progress, no earlier
revision, a pool at its bound) is an outcome to record, never an exception.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from controlplane.errors import ControlPlaneError
from controlplane.models import Action, Deployment, Pool, Worker
from controlplane.services import PoolAtBound, deployment_rollback, pool_scale_by, worker_restart

log = logging.getLogger(__name__)

DONE, SKIPPED, REFUSED = "done", "skipped", "refused"
KINDS = ("scale", "restart", "rollback")


@dataclass(frozen=True, slots=True)
class Outcome:
    status: str  # DONE (action carries the row), SKIPPED (nothing to do) or REFUSED (the service said no)
    action: Action | None = None
    detail: str = ""


def alert_action_carry_out(*, kind: str, deployment: Deployment, actor, reason: str, idempotency_key: str,
                           role: str = "", step: int = 0, worker: Worker | None = None) -> Outcome:
    """Carry out one `scale` (by `step`, negative for down, on the `role` pool), `restart` (of `worker`) or
    `rollback` (of `deployment`) through its service."""
    try:
        if kind == "scale":
            if not Pool.objects.filter(deployment=deployment, role=role).exists():
                return Outcome(SKIPPED, detail=f"deployment has no {role!r} pool to scale")
            action = pool_scale_by(deployment=deployment, role=role, step=step, actor=actor, reason=reason,
                                   idempotency_key=idempotency_key)
        elif kind == "restart":
            if worker is None:
                return Outcome(SKIPPED, detail="the alert names no worker (or it no longer exists)")
            action = worker_restart(worker=worker, actor=actor, reason=reason, idempotency_key=idempotency_key)
        elif kind == "rollback":
            action = deployment_rollback(deployment=deployment, actor=actor, reason=reason,
                                         idempotency_key=idempotency_key)
        else:
            return Outcome(REFUSED, detail=f"unknown action type {kind!r} (one of {', '.join(KINDS)})")
    except PoolAtBound as exc:
        return Outcome(SKIPPED, detail=exc.message)
    except ControlPlaneError as exc:
        log.warning("%s: %s refused: %s", getattr(actor, "name", actor), kind, exc.message)
        return Outcome(REFUSED, detail=exc.message)
    return Outcome(DONE, action)
