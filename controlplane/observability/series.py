"""The reader of the embedded store's series: the query API and the dashboard read here, alert rules and the
autoscaler through observability.reader (whose embedded implementation is this module).

    metric_values(metric="ttft_p99_seconds", deployment=d, role="prefill", aggregation="max", window_s=60)
        one value per series over a window (alert rules, the fleet overview); None: no sample, which a rule must not
        read as 0
    latest_pool_values(deployment_ids=ids, metrics=names, window_s=15, now=t)
        the newest pool aggregates of many deployments in one query (the autoscaler's pass)
    query_series(SeriesQuery(metric=..., deployment_id=..., role=..., worker=..., start=..., end=..., step=...))
        one point per step over a range (GET /api/v1/metrics/query); query_series_many([...]) several at once, those
        of one scope in one query per source (the deployment page's charts)

Source: windows and ranges that start inside raw retention read raw samples (ranges only up to RAW_MAX_RANGE_S);
older ones read the 1-minute rollups (a day of one metric for 10 workers is then 14,400 rows instead of 172,800).
A range read from rollups is completed with the raw samples of the minutes not rolled up yet, so that the newest
points of a long range are there too.
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby

from django.conf import settings
from django.db import connections
from django.db.models import Count, F, FloatField, Sum
from django.db.models.functions import Cast, Floor

from controlplane.models import Deployment, Worker, WorkerPurpose
from controlplane.observability.catalog import METRIC_IDS, METRIC_NAMES, METRICS, SCRAPED_STATUSES
from controlplane.observability.models import Rollup, Sample

__all__ = ["AGGREGATIONS", "MAX_POINTS", "METRICS", "MetricValue", "SeriesQuery", "as_unix", "auto_step",
           "latest_pool_values", "metric_values", "query_series", "query_series_many", "source_for"]

AGGREGATIONS = ("avg", "max", "min", "sum", "last", "count")
MAX_POINTS = 11_000  # per series, as Prometheus' query_range refuses more
RAW_MAX_RANGE_S = 2 * 3600


def as_unix(moment) -> float:
    """A datetime, a Unix timestamp or None (now) as Unix seconds."""
    if moment is None:
        return time.time()
    if isinstance(moment, datetime):
        return moment.timestamp()
    return float(moment)


# --- one value per series over a window ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class MetricValue:
    deployment_id: int
    deployment_name: str
    role: str
    worker_id: int | None  # None: the pool aggregate of (deployment, role)
    value: float | None  # None: no sample in the window
    num_samples: int


def metric_values(*, metric: str, deployment=None, role: str | None = None, worker=None,
                  aggregation: str = "avg", window_s: float = 60, offset_s: float = 0, now=None,
                  per_worker: bool = False, deployments: list[int] | None = None) -> list[MetricValue]:
    """One value per series over the window (now - offset_s - window_s, now - offset_s].

    1. Scope: `deployment` (a Deployment or its id; None = every deployment), `role` (None = every role),
       `worker` (a Worker or its id: only that worker's series). Without `worker`, `per_worker=False` reads the pool
       aggregates (one value per (deployment, role)) and `per_worker=True` one value per worker.
    2. Windows that start inside the raw retention read raw samples; older ones read the 1-minute rollups
       (avg is then weighted by each minute's sample count, min/max/last/sum/count use the rollup columns).
    3. Series expected but silent get value None: the pool of a named (deployment, role), and per worker every worker
       of the scope that holds a process (status starting, ready or draining), so that "worker down" can be seen.
    `deployments` (ids; instead of `deployment`) reads several deployments in one go, with the same answer as one
    read per deployment put together (alert rules of every deployment evaluate this way: one read, not one each).
    Raises ValueError for an unknown metric or aggregation (callers validate their input first).
    """
    if metric not in METRIC_IDS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
    if aggregation not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; known: {', '.join(AGGREGATIONS)}")
    if window_s <= 0:
        raise ValueError(f"window_s must be positive, not {window_s}")
    now_s = as_unix(now)
    end = now_s - float(offset_s)
    start = end - float(window_s)
    deployment_id, worker_id = _id(deployment), _id(worker)

    filters = {"metric": METRIC_IDS[metric], "ts__gt": start, "ts__lte": end}
    if deployment_id is not None:
        filters["deployment_id"] = deployment_id
    elif deployments is not None:
        filters["deployment_id__in"] = list(deployments)
    if role is not None:
        filters["role"] = role
    if worker_id is not None:
        filters["worker_id"] = worker_id
    else:
        filters["worker_id__isnull"] = not per_worker

    grouped: dict[tuple, list] = defaultdict(list)
    if start >= now_s - settings.TANDEM_METRICS_RAW_RETENTION_S:
        rows = Sample.objects.filter(**filters).order_by("ts").values_list(
            "deployment_id", "role", "worker_id", "value")
        for dep, row_role, wid, value in rows:
            grouped[(dep, row_role, wid)].append(value)
        results = {key: (_aggregate(aggregation, values), len(values)) for key, values in grouped.items()}
    else:
        # A rollup minute [ts, ts + 60) belongs to the window when it ends inside it.
        filters["ts__gt"], filters["ts__lte"] = start - 60, end - 60
        rows = Rollup.objects.filter(**filters).order_by("ts").values_list(
            "deployment_id", "role", "worker_id", "avg", "min", "max", "count")
        for dep, row_role, wid, *stats in rows:
            grouped[(dep, row_role, wid)].append(stats)
        results = {key: (_aggregate_rollups(aggregation, minutes), sum(m[3] for m in minutes))
                   for key, minutes in grouped.items()}

    if deployment_id is None and worker_id is None and deployments is not None:
        expected = _expected_keys_of(list(deployments), role, per_worker)
    else:
        expected = _expected_keys(deployment_id, role, worker_id, per_worker)
    for key in expected:
        results.setdefault(key, (None, 0))
    names = dict(Deployment.objects.filter(pk__in={key[0] for key in results}).values_list("id", "name"))
    return [
        MetricValue(deployment_id=dep, deployment_name=names.get(dep, ""), role=row_role, worker_id=wid,
                    value=value, num_samples=num)
        for (dep, row_role, wid), (value, num) in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                                           kv[0][2] or 0))
    ]


def _id(obj) -> int | None:
    if obj is None:
        return None
    return int(getattr(obj, "pk", obj))


def _aggregate(aggregation: str, values: list[float]) -> float | None:
    # `values` are in time order (oldest first).
    if not values:
        return None
    if aggregation == "avg":
        return sum(values) / len(values)
    if aggregation == "max":
        return max(values)
    if aggregation == "min":
        return min(values)
    if aggregation == "sum":
        return sum(values)
    if aggregation == "count":
        return float(len(values))
    return values[-1]  # last


def _aggregate_rollups(aggregation: str, minutes: list) -> float | None:
    # minutes: [avg, min, max, count] in time order.
    if not minutes:
        return None
    total = sum(m[3] for m in minutes)
    if aggregation == "avg":
        return sum(m[0] * m[3] for m in minutes) / total if total else None
    if aggregation == "max":
        return max(m[2] for m in minutes)
    if aggregation == "min":
        return min(m[1] for m in minutes)
    if aggregation == "sum":
        return sum(m[0] * m[3] for m in minutes)
    if aggregation == "count":
        return float(total)
    return minutes[-1][0]  # last: the last minute's average


def _expected_keys(deployment_id, role, worker_id, per_worker) -> list[tuple]:
    if worker_id is not None:
        worker = Worker.objects.filter(pk=worker_id).values_list("deployment_id", "role").first()
        return [(worker[0], worker[1], worker_id)] if worker else []
    if deployment_id is None:
        return []
    if not per_worker:
        return [(deployment_id, role, None)] if role is not None else []
    workers = Worker.objects.filter(deployment_id=deployment_id, status__in=SCRAPED_STATUSES,
                                    purpose=WorkerPurpose.SERVING)
    if role is not None:
        workers = workers.filter(role=role)
    return [(deployment_id, r, wid) for wid, r in workers.values_list("id", "role")]


def _expected_keys_of(deployment_ids: list[int], role, per_worker) -> list[tuple]:
    """_expected_keys of each deployment, in one query."""
    if not per_worker:
        return [(deployment_id, role, None) for deployment_id in deployment_ids] if role is not None else []
    workers = Worker.objects.filter(deployment_id__in=deployment_ids, status__in=SCRAPED_STATUSES,
                                    purpose=WorkerPurpose.SERVING)
    if role is not None:
        workers = workers.filter(role=role)
    return [(dep, r, wid) for wid, dep, r in workers.values_list("id", "deployment_id", "role")]


def latest_pool_values(*, deployment_ids, metrics, window_s: float, now: float,
                       roles=None) -> dict[tuple[int, str, str], float]:
    """(deployment id, role, metric) → the newest pool-aggregate value in (now - window_s, now], for many
    deployments and metrics in one query (the autoscaler evaluates every pool in one pass). Silent series are
    absent.

    `roles` (optional) names the roles to read. With them the read is a few short index ranges (deployment, metric,
    role, pool, the window); without, the index's role column is open and the scan walks every sample of each
    metric of the deployment, all workers and all of raw retention, to find the window's few rows (slow for a
    deployment of many workers).
    """
    filters = {"deployment_id__in": deployment_ids, "worker_id__isnull": True,
               "metric__in": [METRIC_IDS[name] for name in metrics], "ts__gt": now - window_s, "ts__lte": now}
    if roles is not None:
        filters["role__in"] = list(roles)
    rows = Sample.objects.filter(**filters).order_by("ts").values_list("deployment_id", "role", "metric", "value")
    latest: dict[tuple[int, str, str], float] = {}
    for deployment_id, role, metric, value in rows:
        latest[(deployment_id, role, METRIC_NAMES[metric])] = value  # ordered by ts: the newest wins
    return latest


# --- points over a range -------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SeriesQuery:
    """Which series of one deployment, over which range, at which step.

    `role`: None for every role, a role, or a tuple of roles. `worker`: None for the pool aggregates, "all" for
    every worker, a worker id, or a tuple of worker ids. The tuples are exact index prefixes (role IN (...),
    worker_id IN (...)): the deployment page reads ~20 series every refresh, each a few index range scans rather
    than a scan of every series of the metric.
    """

    metric: str
    deployment_id: int
    role: str | tuple[str, ...] | None
    worker: int | str | tuple[int, ...] | None
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
    """(source, [{"deployment_id", "role", "worker_id", "points": [[ts, value], ...]}]), one entry per series that
    has samples in [start, end); each point is the mean of the samples in [ts, ts + step) (rollups weighted by
    their sample count)."""
    return query_series_many([query], now=now)[0]


def query_series_many(queries: list[SeriesQuery], *, now: float) -> list[tuple[str, list[dict]]]:
    """query_series of each query, in order. Queries that differ only in their metric are read together (one
    grouped query per source, `metric IN (...)`): the deployment page draws ~16 lines of two scopes, and one
    round trip per line (three with a rollup range) cost more than the rows on a loaded machine."""
    results: list = [None] * len(queries)
    groups: dict[tuple, list[int]] = {}
    for index, query in enumerate(queries):
        key = (query.deployment_id, query.role, query.worker, query.start, query.end, query.step,
               source_for(query, now))
        groups.setdefault(key, []).append(index)
    rolled_up_until = None  # the end of the newest rollup minute, read once for every rollup group
    for (deployment_id, _, _, start, end, step, source), indexes in groups.items():
        scope = _scope(queries[indexes[0]])
        by_metric: dict[str, list[dict]] = {}
        if scope is not None:
            if source == "rollup" and rolled_up_until is None:
                latest = Rollup.objects.order_by("-ts").values_list("ts", flat=True).first()
                rolled_up_until = latest + 60 if latest is not None else float("-inf")
            by_metric = _read_bucketed(scope=scope, metrics={queries[i].metric for i in indexes}, start=start,
                                       end=end, step=step, source=source, rolled_up_until=rolled_up_until)
        for i in indexes:
            results[i] = (source, [{**item, "deployment_id": deployment_id}
                                   for item in by_metric.get(queries[i].metric, [])])
    return results


def _scope(query: SeriesQuery) -> dict | None:
    """The ORM filters of the query's series (without metric and time); None when an empty tuple selects none."""
    scope: dict = {"deployment_id": query.deployment_id}
    if isinstance(query.role, tuple):
        if not query.role:
            return None
        scope["role__in"] = query.role
    elif query.role is not None:
        scope["role"] = query.role
    if query.worker is None:
        scope["worker_id__isnull"] = True
    elif query.worker == "all":
        scope["worker_id__isnull"] = False
    elif isinstance(query.worker, tuple):
        if not query.worker:
            return None
        scope["worker_id__in"] = query.worker
    else:
        scope["worker_id"] = query.worker
    return scope


def _read_bucketed(*, scope: dict, metrics: set[str], start: float, end: float, step: float, source: str,
                   rolled_up_until: float | None) -> dict[str, list[dict]]:
    """metric → [{"role", "worker_id", "points"}] of the series matching `scope`, one point per bucket
    [start + i·step, start + (i+1)·step) that has samples. A rollup read takes the minutes from `rolled_up_until`
    (the end of the newest rollup minute) from the raw samples.

    The database groups the buckets: the dashboard reads ~20 series every 5 s, and fetching a day of samples into
    Python costs far more than grouping, which returns at most ~300 rows a series.
    """
    names = {METRIC_IDS[metric]: metric for metric in metrics}
    filters = {**scope, "metric__in": sorted(names), "ts__gte": start, "ts__lt": end}
    # COUNT(*), not COUNT(id): the id is not in the series index, and reading it would forgo the index-only scan.
    if source == "raw":
        rows = _rows(_grouped(Sample, filters, start, step, Sum("value"), Count("*")))
    else:
        rollups = _grouped(Rollup, filters, start, step, Sum(F("avg") * F("count"), output_field=FloatField()),
                           Sum("count"))
        raw = _grouped(Sample, {**filters, "ts__gte": max(start, rolled_up_until)}, start, step, Sum("value"),
                       Count("*"))
        rows = _merged_rows(rollups, raw)
    by_metric: dict[str, list[dict]] = {}
    for (metric, role, worker_id), group in groupby(rows, key=lambda row: (row[0], row[1], row[2])):
        points = [[start + int(bucket) * step, total / weight] for *_, bucket, total, weight in group if weight]
        by_metric.setdefault(names[metric], []).append({"role": role, "worker_id": worker_id, "points": points})
    return by_metric


def _grouped(model, filters: dict, start: float, step: float, total, weight):
    bucket = Cast(Floor((F("ts") - start) / step), output_field=FloatField())
    return (model.objects.filter(**filters)
            .annotate(bucket=bucket)
            .values("metric", "role", "worker_id", "bucket")
            .annotate(total=total, weight=weight)
            .order_by("metric", "role", "worker_id", "bucket")
            .values_list("metric", "role", "worker_id", "bucket", "total", "weight"))


def _merged_rows(rollups, raw) -> list[tuple]:
    """The buckets of both grouped queries, summed where a bucket holds the last rolled-up minutes and the first raw
    ones (weighted: totals and weights add), in the same order. The database merges: a day of a per-worker chart
    is ~30,000 bucket rows, which a merge in Python spent a noticeable share of CPU sorting."""
    rollup_sql, rollup_params = rollups.order_by().query.sql_with_params()
    raw_sql, raw_params = raw.order_by().query.sql_with_params()
    # The weights are integers: summed again they would be NUMERIC (Decimal) on PostgreSQL.
    sql = (f"SELECT metric, role, worker_id, bucket, SUM(total), CAST(SUM(weight) AS DOUBLE PRECISION) FROM "
           f"({rollup_sql} UNION ALL {raw_sql})"
           " AS buckets GROUP BY metric, role, worker_id, bucket ORDER BY metric, role, worker_id, bucket")
    with connections[rollups.db].cursor() as cursor:
        cursor.execute(sql, (*rollup_params, *raw_params))
        return cursor.fetchall()


def _rows(queryset) -> list[tuple]:
    """Run an aggregate query on the raw cursor: ~20,000 grouped rows a page refresh, and Django's per-value
    converters would cost as much as the query itself."""
    sql, params = queryset.query.sql_with_params()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
