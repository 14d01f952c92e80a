"""Formatting for the operator pages: durations, bytes, seconds, ratios and status colours."""
from __future__ import annotations

from datetime import timedelta

from django import template

from dashboards.buckets import above_top, histogram_top
from dashboards.plotly_bundle import plotly_version

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
    # rollouts and their analysis runs
    "paused": "warn", "promoted": "ok", "aborted": "bad", "completed": "ok", "passed": "ok", "passing": "ok",
    "waiting": "busy", "report": "muted",
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
def percent(share) -> str:
    """A share (0..1) as a percentage with one decimal ('99.5 %'), or '–' when there is none."""
    if share is None:
        return "–"
    return f"{100 * float(share):.1f} %"


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


def _seconds(value: float) -> str:
    return seconds_ms(value) if value < 1 else f"{value:.2f} s"


_UNIT_FORMATS = {
    "seconds": _seconds,
    "ratio": lambda v: f"{v * 100:.1f}%",
    "bytes": bytes_h,
    "tokens/second": lambda v: f"{v:,.1f} tokens/s",
    "requests/second": lambda v: f"{v:,.2f} req/s",
    "requests": lambda v: f"{v:,.1f} requests",
    "cores": lambda v: f"{v:.2f} cores",
    "tokens": lambda v: f"{v:,.1f} tokens",
    "celsius": lambda v: f"{v:.0f} °C",
    "watts": lambda v: f"{v:,.0f} W",
}


def _unit_of(metric: str) -> str:
    from controlplane.observability.catalog import UNITS

    if metric in UNITS:
        return UNITS[metric]
    # Names outside the catalog (the autoscaler's per-worker request counts) follow the same suffixes.
    for suffix, unit in (("_seconds", "seconds"), ("_ratio", "ratio"), ("_bytes", "bytes")):
        if metric.endswith(suffix):
            return unit
    return "requests" if metric.startswith("requests_") else ""


@register.filter
def metric_value(value, metric: str) -> str:
    """A value of a stored metric with its unit: '850 ms', '1.20 s', '12.5%', '1.5 GiB', '42.0 tokens/s'; a latency
    quantile at its histogram's top bucket is '> 80 s' (dashboards.buckets)."""
    if value is None or value == "":
        return "–"
    value = float(value)
    if above_top(value, str(metric)):
        return f"> {histogram_top(str(metric)):g} s"
    if metric == "up":
        return "down" if value == 0 else "up" if value == 1 else f"{value * 100:.0f}% up"
    formatter = _UNIT_FORMATS.get(_unit_of(str(metric)))
    return formatter(value) if formatter else f"{value:.3g}"


@register.filter
def alert_value(alert) -> str:
    """An alert's value in its rule's unit; a relative rule's value is a ratio to the earlier level ('0.62×')."""
    if alert.value is None:
        return "–"
    if alert.rule.compare_to_offset_s:
        return f"{alert.value:.2f}×"
    return metric_value(alert.value, alert.rule.metric)


def _plain(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{key.replace('_', ' ')} {_plain(item)}" for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return ", ".join(_plain(item) for item in value)
    return str(value)


@register.filter
def outcome(result) -> str:
    """An action's result dict in words: 'revision #2', 'decode: 2 ready', 'superseded by action #12'."""
    if not result:
        return ""
    if not isinstance(result, dict):
        return _plain(result)
    result = dict(result)
    parts = []
    if "role" in result and "num_ready" in result:
        parts.append(f"{result.pop('role')}: {result.pop('num_ready')} ready")
    if "revision" in result:
        parts.append(f"revision #{result.pop('revision')}")
    if "superseded_by" in result:
        parts.append(f"superseded by action #{result.pop('superseded_by')}")
    if "worker_status" in result:
        parts.append(f"worker {result.pop('worker_status')}")
    if "deliveries" in result:
        deliveries = result.pop("deliveries") or []
        parts.append(f"{len(deliveries)} deliver{'y' if len(deliveries) == 1 else 'ies'}"
                     + (f" ({', '.join(f'#{d}' for d in deliveries)})" if deliveries else ""))
    parts.extend(f"{key.replace('_', ' ')}: {_plain(value)}" for key, value in result.items())
    return "; ".join(parts)
