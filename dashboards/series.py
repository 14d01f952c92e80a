"""Chart reads: the observability app's bucketed series (controlplane.observability.series.read_bucketed, the same
reader as GET /api/v1/metrics/query), with the scope narrowed to exact index prefixes (role IN (...),
worker_id IN (...)) so that each read of the page's ~20 series is a few index range scans, not a scan of every
series of the metric.
"""
from __future__ import annotations

from dataclasses import dataclass

from controlplane.observability.series import SeriesQuery, read_bucketed, source_for


@dataclass(frozen=True, slots=True)
class Scope:
    """Which series of one deployment: the pool aggregates of `roles`, or the workers `worker_ids` (of `roles`)."""

    roles: tuple[str, ...]
    worker_ids: tuple[int, ...] | None = None  # None: pool aggregates


def read_series(*, deployment_id: int, metric: str, scope: Scope, start: float, end: float, step: float,
                now: float) -> tuple[str, list[dict]]:
    """(source, [{"role", "worker_id", "points": [[ts, value], ...]}]) like query_series, one entry per series
    that has samples in [start, end)."""
    if not scope.roles or (scope.worker_ids is not None and not scope.worker_ids):
        return "raw", []
    source = source_for(SeriesQuery(metric=metric, deployment_id=deployment_id, role=None, worker=None,
                                    start=start, end=end, step=step), now)
    filters = {"deployment_id": deployment_id, "role__in": scope.roles}
    if scope.worker_ids is None:
        filters["worker_id__isnull"] = True
    else:
        filters["worker_id__in"] = scope.worker_ids
    return source, read_bucketed(scope=filters, metric=metric, start=start, end=end, step=step, source=source)
