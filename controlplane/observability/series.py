"""Time series for the query API and the dashboard: one metric over a time range, downsampled to a step.

Source: raw samples for ranges up to RAW_MAX_RANGE_S that start inside raw retention; 1-minute rollups otherwise
(a day of one metric for 10 workers is then 14,400 rows instead of 172,800), completed with the raw samples of the
minutes not rolled up yet, so that the newest points of a long range are there too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import groupby

from django.conf import settings
from django.db import connections
from django.db.models import Count, F, FloatField, Sum
from django.db.models.functions import Cast, Floor

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
    scope = {"deployment_id": query.deployment_id}
    if query.role is not None:
        scope["role"] = query.role
    if query.worker is None:
        scope["worker_id__isnull"] = True
    elif query.worker == "all":
        scope["worker_id__isnull"] = False
    else:
        scope["worker_id"] = query.worker
    source = source_for(query, now)
    series = read_bucketed(scope=scope, metric=query.metric, start=query.start, end=query.end, step=query.step,
                           source=source)
    for item in series:
        item["deployment_id"] = query.deployment_id
    return source, series


def read_bucketed(*, scope: dict, metric: str, start: float, end: float, step: float, source: str) -> list[dict]:
    """[{"role", "worker_id", "points"}] of the series matching `scope` (ORM filters without metric and time), one
    point per bucket [start + i·step, start + (i+1)·step) that has samples.

    The database groups the buckets: the dashboard reads ~20 series every 5 s, and fetching a day of samples into
    Python costs ~0.4 s where grouping returns at most ~300 rows a series.
    """
    filters = {**scope, "metric": METRIC_IDS[metric], "ts__gte": start, "ts__lt": end}
    raw_from = start
    rows: list[tuple] = []
    if source == "rollup":
        rows = _rows(_grouped(Rollup, filters, start, step,
                              Sum(F("avg") * F("count"), output_field=FloatField()), Sum("count")))
        # The minutes after the newest rollup come from the raw samples.
        latest = Rollup.objects.order_by("-ts").values_list("ts", flat=True).first()
        raw_from = max(start, latest + 60) if latest is not None else start
    raw = _rows(_grouped(Sample, {**filters, "ts__gte": raw_from}, start, step, Sum("value"), Count("id")))
    if rows:
        # A bucket may hold the last rolled-up minutes and the first raw ones: merge, weighted.
        merged: dict[tuple, list] = {}
        for role, worker_id, bucket, total, weight in rows + raw:
            slot = merged.setdefault((role, worker_id or 0, bucket), [role, worker_id, bucket, 0.0, 0])
            slot[3] += total
            slot[4] += weight
        rows = [tuple(slot) for _, slot in sorted(merged.items())]
    else:
        rows = raw
    series = []
    for (role, worker_id), group in groupby(rows, key=lambda row: (row[0], row[1])):
        points = [[start + int(bucket) * step, total / weight] for _, _, bucket, total, weight in group if weight]
        series.append({"role": role, "worker_id": worker_id, "points": points})
    return series


def _grouped(model, filters: dict, start: float, step: float, total, weight):
    bucket = Cast(Floor((F("ts") - start) / step), output_field=FloatField())
    return (model.objects.filter(**filters)
            .annotate(bucket=bucket)
            .values("role", "worker_id", "bucket")
            .annotate(total=total, weight=weight)
            .order_by("role", "worker_id", "bucket")
            .values_list("role", "worker_id", "bucket", "total", "weight"))


def _rows(queryset) -> list[tuple]:
    """Run an aggregate query on the raw cursor: ~20,000 grouped rows a page refresh, and Django's per-value
    converters would cost as much as the query itself."""
    sql, params = queryset.query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
