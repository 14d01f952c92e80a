"""The bodies a channel receives, by kind. Built when the delivery is queued and stored on it."""
from __future__ import annotations

from datetime import datetime

from django.conf import settings

from controlplane.alerting.models import Alert, Channel, ChannelKind

# Alertmanager's zero time: endsAt of an alert that has not ended.
ZERO_TIME = "0001-01-01T00:00:00Z"


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


def alert_summary(alert: Alert, event: str) -> dict:
    rule = alert.rule
    return {
        "rule": rule.name, "rule_id": rule.pk, "fingerprint": alert.fingerprint, "state": alert.state,
        "severity": rule.severity, "labels": alert.labels, "annotations": alert.annotations,
        "value": alert.value, "condition": rule.describe(), "active_at": _iso(alert.active_at),
        "fired_at": _iso(alert.fired_at), "resolved_at": _iso(alert.resolved_at),
        "url": f"{settings.TANDEM_PUBLIC_URL}/api/v1/alerts/{alert.pk}/",
    }


def webhook_payload(alert: Alert, event: str, channel: Channel) -> dict:
    return {"version": "1", "event": event, "channel": channel.name, "alert": alert_summary(alert, event)}


def slack_payload(alert: Alert, event: str, channel: Channel) -> dict:
    labels = alert.labels
    where = f"{labels.get('deployment', '')}/{labels.get('role') or 'all'}"
    if labels.get("worker"):
        where += f" worker {labels['worker']}"
    icon = ":rotating_light:" if event == "firing" else ":white_check_mark:"
    title = f"[{event.upper()}] {alert.rule.name} on {where}"
    value = "no data" if alert.value is None else f"{alert.value:.6g}"
    text = f"{title}: {alert.rule.describe()} (value {value})"
    detail = alert.annotations.get("summary") or alert.annotations.get("description") or ""
    section = f"{icon} *{title}*\n`{alert.rule.describe()}` value *{value}*" + (f"\n{detail}" if detail else "")
    url = alert_summary(alert, event)["url"]
    blocks = [
        {"type": "section", "text": {"type": "mrkdwn", "text": section}},
        {"type": "context",
         "elements": [{"type": "mrkdwn", "text": f"severity {alert.rule.severity} · <{url}|alert>"}]},
    ]
    return {"text": text, "blocks": blocks}


def alertmanager_payload(alert: Alert, event: str, channel: Channel) -> dict:
    """Alertmanager's webhook v4 body with one alert, grouped by alertname, so receivers written for Alertmanager
    (its `webhook_config`) work unchanged."""
    rule = alert.rule
    status = "firing" if event == "firing" else "resolved"
    group_labels = {"alertname": rule.name}
    return {
        "version": "4",
        "groupKey": '{}:{alertname="%s"}' % rule.name,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": channel.name,
        "groupLabels": group_labels,
        "commonLabels": dict(alert.labels),
        "commonAnnotations": dict(alert.annotations),
        "externalURL": settings.TANDEM_PUBLIC_URL,
        "alerts": [{
            "status": status,
            "labels": dict(alert.labels),
            "annotations": dict(alert.annotations),
            "startsAt": _iso(alert.fired_at or alert.active_at),
            "endsAt": _iso(alert.resolved_at) if status == "resolved" else ZERO_TIME,
            "generatorURL": f"{settings.TANDEM_PUBLIC_URL}/api/v1/alert-rules/{rule.pk}/",
            "fingerprint": alert.fingerprint[:16],
        }],
    }


BUILDERS = {
    ChannelKind.WEBHOOK: webhook_payload,
    ChannelKind.SLACK: slack_payload,
    ChannelKind.ALERTMANAGER: alertmanager_payload,
}


def payload_for(channel: Channel, alert: Alert, event: str) -> dict:
    return BUILDERS[ChannelKind(channel.kind)](alert, event, channel)
