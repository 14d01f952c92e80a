"""Tell the notification channels that a rollout was aborted: one delivery per enabled channel, sent by the
alerting app's delivery task (bounded tries, timeout, the outcome on the delivery row)."""
from __future__ import annotations

from controlplane.alerting.models import ChannelKind
from controlplane.alerting.services.notifications import channels_notify


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
    return channels_notify(idempotency_key=idempotency_key, event="aborted",
                           payload=lambda kind: _payload(kind, summary))
