"""Reads of the stored series that the alert rules, the autoscaler and the dashboard share.

    from controlplane.observability.selectors import metric_values, METRICS
    metric_values(metric="ttft_p99_seconds", deployment=d, role="prefill", aggregation="max", window_s=60)

A value is None when the window holds no sample: "no data", which a rule must not read as 0.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings

from controlplane.observability.catalog import METRIC_IDS, METRICS
from controlplane.observability.models import Rollup, Sample

__all__ = ["AGGREGATIONS", "METRICS", "MetricValue", "metric_values", "as_unix"]

AGGREGATIONS = ("avg", "max", "min", "sum", "last", "count")
# Workers whose series a per-worker read always names (value None when silent): those that hold a process.
SCRAPED_STATUSES = ("starting", "ready", "draining")


@dataclass(frozen=True, slots=True)
class MetricValue:
    deployment_id: int
    deployment_name: str
    role: str
    worker_id: int | None  # None: the pool aggregate of (deployment, role)
    value: float | None  # None: no sample in the window
    num_samples: int


def as_unix(moment) -> float:
    """A datetime, a Unix timestamp or None (now) as Unix seconds."""
    if moment is None:
        return time.time()
    if isinstance(moment, datetime):
        return moment.timestamp()
    return float(moment)


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


def metric_values(*, metric: str, deployment=None, role: str | None = None, worker=None,
                  aggregation: str = "avg", window_s: float = 60, offset_s: float = 0, now=None,
                  per_worker: bool = False) -> list[MetricValue]:
    """One value per series over the window (now - offset_s - window_s, now - offset_s].

    1. Scope: `deployment` (a Deployment or its id; None = every deployment), `role` (None = every role),
       `worker` (a Worker or its id: only that worker's series). Without `worker`, `per_worker=False` reads the pool
       aggregates (one value per (deployment, role)) and `per_worker=True` one value per worker.
    2. Windows that start inside the raw retention read raw samples; older ones read the 1-minute rollups
       (avg is then weighted by each minute's sample count, min/max/last/sum/count use the rollup columns).
    3. Series expected but silent get value None: the pool of a named (deployment, role), and per worker every worker
       of the scope that holds a process (status starting, ready or draining), so that "worker down" can be seen.
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
    if role is not None:
        filters["role"] = role
    if worker_id is not None:
        filters["worker_id"] = worker_id
    else:
        filters["worker_id__isnull"] = not per_worker

    grouped: dict[tuple, list] = defaultdict(list)
    use_raw = start >= now_s - settings.TANDEM_METRICS_RAW_RETENTION_S
    if use_raw:
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

    for key in _expected_keys(deployment_id, role, worker_id, per_worker):
        results.setdefault(key, (None, 0))
    names = _deployment_names({key[0] for key in results})
    return [
        MetricValue(deployment_id=dep, deployment_name=names.get(dep, ""), role=row_role, worker_id=wid,
                    value=value, num_samples=num)
        for (dep, row_role, wid), (value, num) in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][1],
                                                                                           kv[0][2] or 0))
    ]


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
    from controlplane.models import Worker

    if worker_id is not None:
        worker = Worker.objects.filter(pk=worker_id).values_list("deployment_id", "role").first()
        return [(worker[0], worker[1], worker_id)] if worker else []
    if deployment_id is None:
        return []
    if not per_worker:
        return [(deployment_id, role, None)] if role is not None else []
    workers = Worker.objects.filter(deployment_id=deployment_id, status__in=SCRAPED_STATUSES)
    if role is not None:
        workers = workers.filter(role=role)
    return [(deployment_id, r, wid) for wid, r in workers.values_list("id", "role")]


def _deployment_names(ids) -> dict[int, str]:
    from controlplane.models import Deployment

    return dict(Deployment.objects.filter(pk__in=ids).values_list("id", "name"))
