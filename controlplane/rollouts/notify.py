"""Tell the notification channels that a rollout was aborted: one delivery per enabled channel, sent by the
alerting app's delivery task (bounded tries, timeout, the outcome on the delivery row)."""
from __future__ import annotations

from controlplane.alerting.models import ChannelKind, Delivery
from controlplane.alerting.services.notifications import channels_for, delivery_enqueue


def _payload(kind: str, summary: dict) -> dict:
    text = (f"Rollout {summary['rollout']} of {summary['deployment']} (revision {summary['revision']}) aborted: "
            f"{summary['reason']}")
    if kind == ChannelKind.SLACK:
        return {"text": text}
    return {"kind": "rollout_aborted", "text": text, **summary}


def rollout_abort_notify(*, rollout, reason: str, failures: list[dict], idempotency_key: str) -> list[int]:
    """Queue the deliveries (inside the abort's transaction; each is sent after commit). Returns their ids."""
    summary = {"deployment": rollout.deployment.name, "rollout": rollout.pk, "strategy": rollout.strategy,
               "revision": rollout.revision.number, "stable_revision": rollout.stable_revision.number,
               "reason": reason, "failures": failures}
    ids = []
    for channel in channels_for(None):
        delivery, created = Delivery.objects.get_or_create(
            idempotency_key=f"{idempotency_key}:{channel.pk}",
            defaults={"channel": channel, "event": "aborted", "payload": _payload(channel.kind, summary)})
        if created:
            delivery_enqueue(delivery.pk)
        ids.append(delivery.pk)
    return ids
