"""Carry out the alerts of an Alertmanager webhook (parsed by controlplane.alerting.webhooks.inbound).

Mapping: labels `deployment` and `role` (the pool), optional `worker` (an id, for restart); the annotation (or
label) `tandem_action`: one of action_kinds.INBOUND, and `tandem_<kind>_<parameter>` (`tandem_scale_step`,
default 1).
Only firing alerts act. The idempotency key comes from the alert (inbound_key), so a redelivery acts once.
"""
from __future__ import annotations

from controlplane.alerting.services import carry_out
from controlplane.alerting.services.action_kinds import ALERT, INBOUND, POOL, WORKER
from controlplane.alerting.webhooks.inbound import InboundAlert, InboundPayload, alert_field, inbound_key, positive_int
from controlplane.errors import ControlPlaneError
from controlplane.models import ActionKind, ActionStatus, Deployment, Pool, Worker
from controlplane.selectors import MAX_ID
from controlplane.services import Actor, DuplicateAction, action_create, action_find

_OUTCOME = {carry_out.DONE: "created", carry_out.SKIPPED: "skipped", carry_out.REFUSED: "refused"}


def alert_apply(payload: InboundPayload, alert: InboundAlert, *, user) -> dict:
    """Carry out one alert's tandem_action; returns its outcome for the response (never raises a domain error:
    one refused alert must not make Alertmanager retry the whole group)."""
    outcome = {"index": alert.index, "fingerprint": alert.fingerprint, "status": alert.status}
    wanted = alert_field(alert, payload, "tandem_action")
    if alert.status != "firing":
        return {**outcome, "outcome": "ignored", "detail": "resolved alerts do not act"}
    if not wanted:
        return {**outcome, "outcome": "ignored", "detail": "no tandem_action annotation"}
    if wanted not in INBOUND:
        return {**outcome, "outcome": "rejected", "detail": f"tandem_action must be one of {', '.join(INBOUND)}"}
    key = inbound_key(payload, alert)
    existing = action_find(key)
    if existing is not None:
        return {**outcome, "outcome": "duplicate", "action": existing.pk}
    name = alert.labels.get("deployment") or payload.common_labels.get("deployment")
    deployment = Deployment.objects.filter(name=name).first() if name else None
    if deployment is None:
        return {**outcome, "outcome": "rejected", "detail": f"label deployment names no deployment ({name!r})"}
    actor = Actor("webhook", f"alertmanager:{payload.receiver or 'webhook'}"[:150], user)
    alertname = alert.labels.get("alertname", "")
    reason = (f"Alertmanager alert {alertname!r} ({alert.fingerprint}) firing since "
              f"{alert.starts_at.isoformat() if alert.starts_at else '?'}: {wanted}")
    summary = alert.annotations.get("summary") or alert.annotations.get("description")
    if summary:
        reason += f" — {summary}"
    role = alert.labels.get("role") or payload.common_labels.get("role") or ""
    common = dict(deployment=deployment, actor=actor, reason=reason, idempotency_key=key)
    kind, params = INBOUND[wanted]
    if kind.acts_on == ALERT:
        return {**outcome, **_audit_notify(alert, **common)}
    worker = None
    if kind.acts_on == POOL and not Pool.objects.filter(deployment=deployment, role=role).exists():
        return {**outcome, "outcome": "rejected", "detail": f"label role names no pool of {name} ({role!r})"}
    if kind.acts_on == WORKER:
        worker_id = positive_int(alert.labels.get("worker", ""), most=MAX_ID)
        worker = Worker.objects.filter(pk=worker_id, deployment=deployment).first() if worker_id else None
        if worker is None:
            return {**outcome, "outcome": "rejected", "detail": f"label worker names no worker of {name}"}
    params = dict(params)
    for param in kind.params:
        annotation = f"tandem_{kind.name}_{param.name}"
        text = alert_field(alert, payload, annotation) if param.from_text is not None else ""
        if text:
            try:
                params[param.name] = param.from_text(text, annotation)
            except ControlPlaneError as exc:
                return {**outcome, "outcome": "rejected", "detail": exc.message}
    result = carry_out.alert_action_carry_out(kind=kind.name, params=params, role=role, worker=worker, **common)
    if result.status == carry_out.DONE:
        return {**outcome, "outcome": "created", "action": result.action.pk}
    return {**outcome, "outcome": _OUTCOME[result.status], "detail": result.detail}


def _audit_notify(alert: InboundAlert, *, deployment, actor, reason: str, idempotency_key: str) -> dict:
    """notify: recorded in the audit log (the alert already reached its humans through Alertmanager)."""
    try:
        action = action_create(kind=ActionKind.NOTIFY, actor=actor, deployment=deployment, reason=reason,
                               status=ActionStatus.SUCCEEDED, idempotency_key=idempotency_key,
                               params={"source": "alertmanager", "labels": alert.labels})
    except DuplicateAction as dup:  # the same alert delivered twice at once: the other request acted
        return {"outcome": "duplicate", "action": dup.action.pk}
    except ControlPlaneError as exc:
        return {"outcome": "refused", "detail": exc.message}
    return {"outcome": "created", "action": action.pk}
