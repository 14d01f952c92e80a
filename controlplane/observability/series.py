"""Time series for the query API and the dashboard: one metric over a time range, downsampled to a step.

Source: raw samples for ranges up to RAW_MAX_RANGE_S that start inside raw retention; 1-minute rollups otherwise
(a day of one metric for 10 workers is then 14,400 rows instead of 172,800), completed with the raw samples of the
minutes not rolled up yet, so that the newest points of a long range are there too.
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings

from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Rollup, Sample

MAX_POINTS = 11_000  # per series, as Prometheus' query_range refuses more
RAW_MAX_RANGE_S = 2 * 3600


@dataclass(frozen=True, slots=True)
class SeriesQuery:
    metric: str
    deployment_id: int
    role: str | None
    worker: int | str | None  # None: pool aggregates; "all": every worker; an id: that worker
    start: float
    end: float
    step: float


def auto_step(start: float, end: float) -> float:
    """About 300 points per series, never finer than the scrape interval, in whole seconds."""
    return float(max(settings.TANDEM_SCRAPE_INTERVAL_S, math.ceil((end - start) / 300)))


def source_for(query: SeriesQuery, now: float) -> str:
    starts_in_raw = query.start >= now - settings.TANDEM_METRICS_RAW_RETENTION_S
    return "raw" if starts_in_raw and query.end - query.start <= RAW_MAX_RANGE_S else "rollup"


def query_series(query: SeriesQuery, *, now: float) -> tuple[str, list[dict]]:
    """(source, [{"deployment_id", "role", "worker_id", "points": [[ts, value], ...]}]); each point is the mean of
    the samples in [ts, ts + step) (rollups weighted by their sample count)."""
    source = source_for(query, now)
    filters = {"deployment_id": query.deployment_id, "metric": METRIC_IDS[query.metric],
               "ts__gte": query.start, "ts__lt": query.end}
    if query.role is not None:
        filters["role"] = query.role
    if query.worker is None:
        filters["worker_id__isnull"] = True
    elif query.worker == "all":
        filters["worker_id__isnull"] = False
    else:
        filters["worker_id"] = query.worker
    raw_from = query.start
    rows = []
    if source == "rollup":
        rows = list(Rollup.objects.filter(**filters).values_list("role", "worker_id", "ts", "avg", "count"))
        # The minutes after the newest rollup come from the raw samples.
        latest = Rollup.objects.order_by("-ts").values_list("ts", flat=True).first()
        raw_from = max(query.start, latest + 60) if latest is not None else query.start
    filters["ts__gte"] = raw_from
    rows.extend(Sample.objects.filter(**filters).values_list("role", "worker_id", "ts", "value"))
    # key → bucket index → [weighted sum, weight]
    buckets: dict[tuple, dict[int, list[float]]] = defaultdict(dict)
    start, step = query.start, query.step
    for role, worker_id, ts, value, *count in rows:
        weight = count[0] if count else 1
        slot = buckets[(role, worker_id)].setdefault(int((ts - start) // step), [0.0, 0])
        slot[0] += value * weight
        slot[1] += weight
    series = []
    for (role, worker_id), slots in sorted(buckets.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        points = [[start + index * step, total / weight] for index, (total, weight) in sorted(slots.items())]
        series.append({"deployment_id": query.deployment_id, "role": role, "worker_id": worker_id,
                       "points": points})
    return source, series
