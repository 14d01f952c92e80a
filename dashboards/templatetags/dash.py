"""Formatting for the operator pages: durations, bytes, seconds, ratios and status colours."""
from __future__ import annotations

from datetime import timedelta

from django import template

register = template.Library()

STATUS_CLASSES = {
    # workers
    "ready": "ok", "starting": "busy", "pending": "busy", "draining": "warn", "stopped": "muted", "failed": "bad",
    # actions
    "succeeded": "ok", "running": "busy",
    # alerts
    "firing": "bad", "resolved": "ok", "inactive": "muted",
    # deployment health
    "healthy": "ok", "degraded": "warn", "down": "bad", "deleting": "muted", "scaled to zero": "muted",
    # severities
    "critical": "bad", "warning": "warn", "info": "muted",
}


@register.filter
def status_class(value) -> str:
    return STATUS_CLASSES.get(str(value), "muted")


@register.filter
def duration(value) -> str:
    """A timedelta (or seconds) as '3d 4h', '2h 5m', '4m 10s', '12s'."""
    if value is None or value == "":
        return "–"
    seconds = int(value.total_seconds() if isinstance(value, timedelta) else float(value))
    if seconds < 0:
        seconds = 0
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


@register.filter
def seconds_ms(value) -> str:
    """Seconds as milliseconds ('123 ms'), or '–' when there is no value."""
    if value is None:
        return "–"
    ms = float(value) * 1000
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


@register.filter
def number(value, digits: int = 1) -> str:
    if value is None:
        return "–"
    return f"{float(value):.{int(digits)}f}"


@register.filter
def bytes_h(value) -> str:
    if value is None:
        return "–"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


@register.filter
def get(mapping, key):
    return mapping.get(key) if hasattr(mapping, "get") else None


@register.simple_tag
def plotly_js_url() -> str:
    from django.urls import reverse

    from dashboards.views.assets import plotly_version

    return reverse("dashboards:plotly-js", args=[plotly_version()])


@register.filter
def elapsed(start, end) -> str:
    """The duration from `start` to `end` (datetimes), e.g. '4s' or '2m 10s'."""
    if start is None or end is None:
        return "–"
    return duration(end - start)


@register.filter
def ago(moment) -> str:
    """'12s ago', '4m 2s ago': seconds matter during an incident, where `timesince` says '0 minutes'."""
    if moment is None:
        return "never"
    from django.utils import timezone

    return f"{duration(timezone.now() - moment)} ago"
