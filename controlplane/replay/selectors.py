"""Reads of the replay app's tables: a deployment's traces, one trace's summary, a window of its requests."""
from __future__ import annotations

from django.db.models import Avg, Count, Max, Min, Q

from controlplane.errors import invalid, not_found
from controlplane.models import Deployment
from controlplane.replay.models import RECORDED, Trace, TraceRequest


def trace_list(deployment: Deployment) -> list[dict]:
    traces = (Trace.objects.filter(deployment=deployment).order_by("name")
              .annotate(num=Count("requests"), first=Min("requests__at_s"), last=Max("requests__at_s")))
    return [_summary(trace, trace.num, trace.first, trace.last) for trace in traces]


def trace_get(deployment: Deployment, name: str) -> Trace:
    trace = Trace.objects.filter(deployment=deployment, name=name).first() if isinstance(name, str) else None
    if trace is None:
        if name == RECORDED:  # every deployment has one, empty until its gateways record
            from controlplane.replay.services import recorded_trace
            return recorded_trace(deployment)
        raise not_found(f"deployment {deployment.name} has no trace named {name!r}")
    return trace


def trace_detail(trace: Trace) -> dict:
    stats = TraceRequest.objects.filter(trace=trace).aggregate(
        num=Count("id"), first=Min("at_s"), last=Max("at_s"), prompt=Avg("prompt_tokens"),
        completion=Avg("completion_tokens"), tenants=Count("tenant", distinct=True),
        with_hashes=Count("id", filter=~Q(hashes=[])))
    outcomes = dict(TraceRequest.objects.filter(trace=trace).values_list("outcome").annotate(n=Count("id")))
    out = _summary(trace, stats["num"], stats["first"], stats["last"])
    out.update(prompt_tokens_mean=stats["prompt"], completion_tokens_mean=stats["completion"],
               tenants=stats["tenants"], with_prefix_hashes=stats["with_hashes"],
               outcomes={key or "unknown": value for key, value in outcomes.items()})
    return out


def _summary(trace: Trace, num: int, first: float | None, last: float | None) -> dict:
    return {"name": trace.name, "format": trace.format, "start": trace.start.isoformat(), "requests": num,
            "first_s": first, "last_s": last, "duration_s": (last - first) if num else 0.0,
            "recording": trace.recording, "sample": trace.sample,
            "created_at": trace.created_at.isoformat(), "created_by": trace.created_by}


def trace_window(trace: Trace, *, since_s: float | None = None, until_s: float | None = None):
    """The trace's requests with since_s ≤ at_s < until_s (seconds from the trace's start), in arrival order."""
    if since_s is not None and until_s is not None and since_s >= until_s:
        raise invalid(f"since ({since_s:g}) must be before until ({until_s:g})", field="since")
    rows = TraceRequest.objects.filter(trace=trace)
    if since_s is not None:
        rows = rows.filter(at_s__gte=since_s)
    if until_s is not None:
        rows = rows.filter(at_s__lt=until_s)
    return rows.order_by("at_s", "id")
