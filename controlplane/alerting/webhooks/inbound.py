"""Alertmanager → Tandem: parse and validate a webhook v4 body (controlplane.alerting.services.alertmanager acts on it).

Mapping convention (docs in controlplane/alerting/README.md):
- labels `deployment` (required for an action) and `role` (the pool: prefill, decode or colocated), optional
  `worker` (a worker id, for restart);
- annotation (or label) `tandem_action`: one of alerting.services.action_kinds.INBOUND (scale_up, notify, ...),
  and optional `tandem_scale_step` (default 1). An alert without `tandem_action` is recorded and ignored.
- Only `firing` alerts act; a `resolved` one is acknowledged.
Alertmanager delivers at least once: the idempotency key is derived from groupKey + fingerprint + status + startsAt
(startsAt: a later firing episode of the same alert is a new one and may act again).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime

from django.utils.dateparse import parse_datetime

from controlplane.errors import invalid
from controlplane.services.validation import each_object

@dataclass(frozen=True, slots=True)
class InboundAlert:
    index: int
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime | None
    ends_at: datetime | None
    generator_url: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class InboundPayload:
    version: str
    group_key: str
    status: str
    receiver: str
    group_labels: dict
    common_labels: dict
    common_annotations: dict
    external_url: str
    alerts: list[InboundAlert]


def _string_map(value, field: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise invalid(f"{field} must be an object", field=field)
    for key, item in value.items():
        if not isinstance(item, str):
            raise invalid(f"{field}.{key} must be a string", field=f"{field}.{key}")
    return value


def _string(body: dict, key: str, field: str, *, required: bool = True, default: str = "") -> str:
    if key not in body or body[key] is None:
        if required:
            raise invalid(f"{field} is required", field=field)
        return default
    if not isinstance(body[key], str):
        raise invalid(f"{field} must be a string", field=field)
    return body[key]


def positive_int(raw: str, *, most: int) -> int | None:
    """1..most from ASCII digits, else None. Not str.isdigit(): it is true for '²' or '٣', which int() refuses or
    reads, and a label is free text; the bound keeps a 30-digit id out of the database driver (bigint overflow)."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19:
        return None
    value = int(raw)
    return value if 1 <= value <= most else None


def _time(body: dict, key: str, field: str) -> datetime | None:
    raw = _string(body, key, field, required=False)
    if not raw or raw.startswith("0001-01-01"):
        return None  # Alertmanager's zero time: not ended
    try:
        moment = parse_datetime(raw)
    except ValueError:
        moment = None
    if moment is None:
        raise invalid(f"{field} must be an RFC 3339 time, not {raw!r}", field=field)
    return moment


def parse_payload(body) -> InboundPayload:
    """Validate Alertmanager's webhook v4 body; unknown extra fields are ignored. 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object (Alertmanager's webhook v4 payload)", field="body")
    version = _string(body, "version", "version")
    if version != "4":
        raise invalid(f"version must be \"4\" (Alertmanager's webhook format), not {version!r}", field="version")
    status = _string(body, "status", "status")
    if status not in ("firing", "resolved"):
        raise invalid("status must be 'firing' or 'resolved'", field="status")
    alerts_raw = body.get("alerts")
    if not isinstance(alerts_raw, list):
        raise invalid("alerts must be a list", field="alerts")
    alerts = []
    for where, raw in each_object(alerts_raw, field="alerts"):
        alert_status = _string(raw, "status", f"{where}.status")
        if alert_status not in ("firing", "resolved"):
            raise invalid(f"{where}.status must be 'firing' or 'resolved'", field=f"{where}.status")
        if "labels" not in raw:
            raise invalid(f"{where}.labels is required", field=f"{where}.labels")
        labels = _string_map(raw["labels"], f"{where}.labels")
        annotations = _string_map(raw.get("annotations") or {}, f"{where}.annotations")
        fingerprint = _string(raw, "fingerprint", f"{where}.fingerprint", required=False)
        if not fingerprint:
            # Older senders omit it: the same hash of the sorted labels every time.
            fingerprint = hashlib.sha256(repr(sorted(labels.items())).encode()).hexdigest()[:16]
        alerts.append(InboundAlert(
            index=len(alerts), status=alert_status, labels=labels, annotations=annotations,
            starts_at=_time(raw, "startsAt", f"{where}.startsAt"), ends_at=_time(raw, "endsAt", f"{where}.endsAt"),
            generator_url=_string(raw, "generatorURL", f"{where}.generatorURL", required=False),
            fingerprint=fingerprint))
    return InboundPayload(
        version=version, group_key=_string(body, "groupKey", "groupKey"), status=status,
        receiver=_string(body, "receiver", "receiver", required=False),
        group_labels=_string_map(body.get("groupLabels") or {}, "groupLabels"),
        common_labels=_string_map(body.get("commonLabels") or {}, "commonLabels"),
        common_annotations=_string_map(body.get("commonAnnotations") or {}, "commonAnnotations"),
        external_url=_string(body, "externalURL", "externalURL", required=False), alerts=alerts)


def inbound_key(payload: InboundPayload, alert: InboundAlert) -> str:
    starts = alert.starts_at.isoformat() if alert.starts_at else ""
    digest = hashlib.sha256("\x00".join([payload.group_key, alert.fingerprint, alert.status, starts]).encode())
    return f"alertmanager:{digest.hexdigest()}"


def alert_field(alert: InboundAlert, payload: InboundPayload, name: str) -> str:
    # The alert's own annotations/labels first, then the group's common ones.
    for source in (alert.annotations, alert.labels, payload.common_annotations, payload.common_labels):
        if source.get(name):
            return source[name]
    return ""
