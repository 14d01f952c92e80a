"""The `prometheus` metrics backend's reader: PromQL instant queries over the HTTP API
(https://prometheus.io/docs/prometheus/latest/querying/api/) against the recording rules of recording_rules.py,
each bounded by TANDEM_PROMETHEUS_TIMEOUT_S and tried once (the loops run again in a few seconds).

    metric_values(...)      → <aggregation>_over_time(tandem_pool:<metric>{deployment=~"a|b", pool="decode"}[60s])
                              at time now - offset (one query for every deployment of a read)
    latest_pool_values(...) → {__name__=~"tandem_pool:(m1|m2)", ...}[15s]: the newest sample of each series

Answers follow series.metric_values' contract: deployments by id (the `deployment` label is its name), the pool
aggregate under worker None, and the series expected but silent (a named pool, each worker holding a process) with
value None. NaN (a ratio or quantile of no requests) is no data, as in the embedded store. `num_samples` is 1 for a
value (Prometheus aggregates server-side and does not count). Catalog series without a recording rule read as no
data; `unschedulable_replicas` (the control plane's own figure) is read from the Pool rows, as of now.
"""
from __future__ import annotations

import math
import threading
import time

import requests

from controlplane.observability import series
from controlplane.observability.recording_rules import POOL_PREFIX, WORKER_PREFIX, recorded_metrics
from controlplane.observability.series import AGGREGATIONS, METRICS, MetricValue, as_unix

PROBLEM_TTL_S = 5.0  # /healthz comes every few seconds: one readiness probe per this long at most
_OVER_TIME = {"avg": "avg_over_time", "max": "max_over_time", "min": "min_over_time", "sum": "sum_over_time",
              "count": "count_over_time", "last": "last_over_time"}


class MetricsUnavailable(Exception):
    """The metrics backend did not answer (unreachable, timed out, or an error answer); the message says which
    (raised by the readers of observability.reader, which exports it)."""


class PrometheusReader:
    name = "prometheus"

    def __init__(self, *, url: str, timeout_s: float) -> None:
        self.url, self.timeout_s = url.rstrip("/"), float(timeout_s)
        self._session = requests.Session()
        self._lock = threading.Lock()
        self._problem: tuple[float, str | None] | None = None

    # --- HTTP -------------------------------------------------------------------------------------------------

    def query(self, expr: str, *, at: float) -> list[dict]:
        """The result of one instant query at `at` (Unix seconds): a vector or a matrix, as the API returns it."""
        try:
            response = self._session.get(f"{self.url}/api/v1/query", params={"query": expr, "time": f"{at:.3f}"},
                                         timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise MetricsUnavailable(f"Prometheus at {self.url} did not answer: {type(exc).__name__}") from exc
        try:
            body = response.json()
        except ValueError:
            raise MetricsUnavailable(f"Prometheus at {self.url} answered HTTP {response.status_code} without "
                                     f"JSON") from None
        if body.get("status") != "success":
            raise MetricsUnavailable(f"Prometheus at {self.url} refused a query ({body.get('errorType')}: "
                                     f"{body.get('error')}): {expr[:200]}")
        return body["data"]["result"]

    def problem(self) -> str | None:
        with self._lock:
            if self._problem is None or time.monotonic() - self._problem[0] > PROBLEM_TTL_S:
                self._problem = (time.monotonic(), self._probe())
            return self._problem[1]

    def _probe(self) -> str | None:
        try:
            response = self._session.get(f"{self.url}/-/ready", timeout=self.timeout_s)
        except requests.RequestException as exc:
            return f"Prometheus at {self.url} unreachable: {type(exc).__name__}"
        if response.status_code != 200:
            return f"Prometheus at {self.url} not ready: HTTP {response.status_code}"
        return None

    # --- the reads --------------------------------------------------------------------------------------------

    def metric_values(self, *, metric: str, deployment=None, role: str | None = None, worker=None,
                      aggregation: str = "avg", window_s: float = 60, offset_s: float = 0, now=None,
                      per_worker: bool = False, deployments: list[int] | None = None) -> list[MetricValue]:
        if metric not in METRICS:
            raise ValueError(f"unknown metric {metric!r}; known: {', '.join(METRICS)}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown aggregation {aggregation!r}; known: {', '.join(AGGREGATIONS)}")
        if window_s <= 0:
            raise ValueError(f"window_s must be positive, not {window_s}")
        deployment_id, worker_id = series._id(deployment), series._id(worker)
        ids = [deployment_id] if deployment_id is not None else (list(deployments) if deployments is not None
                                                                 else None)
        names = _deployment_names(ids)
        per_worker = per_worker or worker_id is not None
        results: dict[tuple, tuple[float | None, int]] = {}
        if metric == "unschedulable_replicas":
            if not per_worker:
                results = _unschedulable(names, role)
        elif metric in recorded_metrics() and names:
            matchers = [f'deployment=~"{"|".join(sorted(names.values()))}"']
            if role is not None:
                matchers.append(f'pool="{role}"')
            if worker_id is not None:
                matchers.append(f'worker="{worker_id}"')
            selector = f"{WORKER_PREFIX if per_worker else POOL_PREFIX}{metric}{{{', '.join(matchers)}}}"
            end = as_unix(now) - float(offset_s)
            by_name = {name: pk for pk, name in names.items()}
            expr = f"{_OVER_TIME[aggregation]}({selector}[{_duration(window_s)}])"
            for item in self.query(expr, at=end):
                labels = item["metric"]
                pk = by_name.get(labels.get("deployment", ""))
                wid = labels.get("worker") if per_worker else None
                if pk is None or (wid is not None and not wid.isdigit()):
                    continue
                value = _number(item["value"][1])
                results[(pk, labels.get("pool", ""), int(wid) if wid is not None else None)] = (
                    value, 0 if value is None else 1)
        if deployment_id is None and worker_id is None and deployments is not None:
            expected = series._expected_keys_of(list(deployments), role, per_worker)
        else:
            expected = series._expected_keys(deployment_id, role, worker_id, per_worker)
        for key in expected:
            results.setdefault(key, (None, 0))
        return [MetricValue(deployment_id=dep, deployment_name=names.get(dep, ""), role=row_role, worker_id=wid,
                            value=value, num_samples=num)
                for (dep, row_role, wid), (value, num) in sorted(results.items(),
                                                                 key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0))]

    def latest_pool_values(self, *, deployment_ids, metrics, window_s: float, now: float,
                           roles=None) -> dict[tuple[int, str, str], float]:
        wanted = sorted(set(metrics) & recorded_metrics())
        names = _deployment_names(list(deployment_ids))
        if not wanted or not names:
            return {}
        matchers = [f'__name__=~"{POOL_PREFIX}({"|".join(wanted)})"',
                    f'deployment=~"{"|".join(sorted(names.values()))}"']
        if roles is not None:
            matchers.append(f'pool=~"{"|".join(sorted(roles))}"')
        by_name = {name: pk for pk, name in names.items()}
        latest: dict[tuple[int, str, str], float] = {}
        for item in self.query(f"{{{', '.join(matchers)}}}[{_duration(window_s)}]", at=float(now)):
            labels = item["metric"]
            pk = by_name.get(labels.get("deployment", ""))
            value = _number(item["values"][-1][1]) if item.get("values") else None
            if pk is not None and value is not None:
                latest[(pk, labels.get("pool", ""), labels["__name__"].removeprefix(POOL_PREFIX))] = value
        return latest


def _duration(seconds: float) -> str:
    return f"{max(int(round(seconds * 1000)), 1)}ms"


def _number(text: str) -> float | None:
    value = float(text)
    return None if math.isnan(value) else value


def _deployment_names(ids: list[int] | None) -> dict[int, str]:
    """id → name (a slug: safe inside a PromQL regex as it is) of the scope; None is every deployment."""
    from controlplane.models import Deployment

    rows = Deployment.objects.all() if ids is None else Deployment.objects.filter(pk__in=ids)
    return dict(rows.values_list("id", "name"))


def _unschedulable(names: dict[int, str], role: str | None) -> dict[tuple, tuple[float | None, int]]:
    from controlplane.models import Pool

    rows = Pool.objects.filter(deployment_id__in=list(names))
    if role is not None:
        rows = rows.filter(role=role)
    return {(dep, pool_role, None): (float(num), 1)
            for dep, pool_role, num in rows.values_list("deployment_id", "role", "unschedulable_replicas")}
