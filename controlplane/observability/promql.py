"""The `prometheus` metrics backend's reader: PromQL over the HTTP API
(https://prometheus.io/docs/prometheus/latest/querying/api/) against the recording rules of recording_rules.py,
each query bounded by TANDEM_PROMETHEUS_TIMEOUT_S and tried once (the loops run again in a few seconds, a page
refreshes in five).

    metric_values(...)      → <aggregation>_over_time(tandem_pool:<metric>{deployment=~"a|b", pool="decode"}[60s])
                              at time now - offset (one instant query for every deployment of a read)
    latest_pool_values(...) → {__name__=~"tandem_pool:(m1|m2)", ...}[15s]: the newest sample of each series
    tenant_metric_values(...) → <aggregation>_over_time(tandem_tenant:<metric>{tenant="acme", deployment=~"a|b"}[60s])
    tenant_range(...)       → query_range of avg_over_time(tandem_tenant:<metric>{tenant="acme"}[step]) per metric
    revision_range(...)     → query_range of avg_over_time(tandem_revision:<metric>{deployment="a",
                              revision=~"1|2"}[step]) per metric
    query_range(queries)    → query_range of avg_over_time(tandem_worker:<metric>{deployment="a", pool=~"...",
                              worker=~"..."}[step]) per line of a chart, evaluated at the end of each step
    gateway_counters(...)   → {__name__=~"<a gateway's request series>", deployment="a", pool="gateway",
                              worker="9"}[window]: raw samples, one snapshot per scrape (gateway_counters.py)

Answers follow series.metric_values' contract: deployments by id (the `deployment` label is its name), the pool
aggregate under worker None, and the series expected but silent (a named pool, each worker holding a process) with
value None. NaN (a ratio or quantile of no requests) is no data, as in the embedded store. `num_samples` is 1 for a
value (Prometheus aggregates server-side and does not count). Catalog series without a recording rule read as no
data; `unschedulable_replicas` (the control plane's own figure) is read from the Pool rows, as of now (and is
charted by no page). Range answers follow series.query_series_many's, with "prometheus" as their source.
"""
from __future__ import annotations

import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import requests

from controlplane.observability import series
from controlplane.observability.catalog import TENANT_METRICS
from controlplane.observability.exposition import Reading, parse_exposition
from controlplane.observability.gateway_counters import exposition_line, range_selector, scraped_counters
from controlplane.observability.recording_rules import (POOL_PREFIX, REVISION_METRICS, REVISION_PREFIX, TENANT_PREFIX,
                                                        WORKER_PREFIX, recorded_metrics)
from controlplane.observability.scraper import Target
from controlplane.observability.series import AGGREGATIONS, METRICS, MetricValue, SeriesQuery, as_unix
from controlplane.observability.tenant_series import TENANT_ROLE, check_tenant_read

RANGE_CONCURRENCY = 8  # range queries in flight at once for one read (a page's lines)
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
        return self._get("query", expr, {"time": f"{at:.3f}"})

    def query_range_expr(self, expr: str, *, start: float, end: float, step: float) -> list[dict]:
        """The matrix of one range query: `expr` evaluated at start, start + step, ... up to end."""
        return self._get("query_range", expr, {"start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"})

    def _get(self, endpoint: str, expr: str, params: dict) -> list[dict]:
        try:
            response = self._session.get(f"{self.url}/api/v1/{endpoint}", params={"query": expr, **params},
                                         timeout=self.timeout_s)
        except requests.RequestException as exc:
            raise MetricsUnavailable(f"Prometheus at {self.url} did not answer: {type(exc).__name__}") from exc
        try:
            body = response.json()
        except ValueError:
            raise MetricsUnavailable(f"Prometheus at {self.url} answered HTTP {response.status_code} without "
                                     f"JSON") from None
        if not isinstance(body, dict):
            raise MetricsUnavailable(f"Prometheus at {self.url} answered HTTP {response.status_code} with JSON "
                                     f"that is not the Prometheus API's")
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

    def tenant_metric_values(self, *, metric: str, tenant: str, deployments: list[int] | None = None,
                             aggregation: str = "avg", window_s: float = 60, offset_s: float = 0,
                             now=None) -> list[MetricValue]:
        """tenant_series.tenant_metric_values' answer, from the tandem_tenant: recording rules."""
        check_tenant_read(metric, aggregation, window_s)
        names = _deployment_names(list(deployments) if deployments is not None else None)
        if not names:
            return []
        by_name = {name: pk for pk, name in names.items()}
        # Tenant names are DNS labels (and `_anonymous`): nothing to escape in a matcher.
        selector = (f'{TENANT_PREFIX}{metric}{{tenant="{tenant}", '
                    f'deployment=~"{"|".join(sorted(names.values()))}"}}')
        expr = f"{_OVER_TIME[aggregation]}({selector}[{_duration(window_s)}])"
        values = {}
        for item in self.query(expr, at=as_unix(now) - float(offset_s)):
            pk = by_name.get(item["metric"].get("deployment", ""))
            value = _number(item["value"][1])
            if pk is not None and value is not None:
                values[pk] = value
        return [MetricValue(deployment_id=pk, deployment_name=names[pk], role=TENANT_ROLE, worker_id=None,
                            value=value, num_samples=1) for pk, value in sorted(values.items())]

    def tenant_range(self, *, tenant: str, metrics: list[str], start: float, end: float,
                     step: float) -> dict[str, list[dict]]:
        """tenant_series.tenant_series_range's answer: one `query_range` per metric over its tandem_tenant: rule,
        bucketed as _range does (a point at t is the mean of the recorded samples in [t, t + step])."""
        wanted = [metric for metric in dict.fromkeys(metrics) if metric in TENANT_METRICS]
        if not wanted:
            return {}
        by_name = {name: pk for pk, name in _deployment_names(None).items()}
        num_buckets = max(math.ceil((end - start) / step), 1)

        def read(metric: str) -> list[dict]:
            matrix = self.query_range_expr(
                f'avg_over_time({TENANT_PREFIX}{metric}{{tenant="{tenant}"}}[{_duration(step)}])',
                start=start + step, end=start + num_buckets * step, step=step)
            found = []
            for item in matrix:
                pk = by_name.get(item["metric"].get("deployment", ""))
                points = [[start + (round((float(at) - start) / step) - 1) * step, value]
                          for at, value in ((at, _number(text)) for at, text in item["values"]) if value is not None]
                if pk is not None and points:
                    found.append({"deployment_id": pk, "points": points})
            return sorted(found, key=lambda entry: entry["deployment_id"])

        with ThreadPoolExecutor(max_workers=min(RANGE_CONCURRENCY, len(wanted))) as pool:
            answers = dict(zip(wanted, pool.map(read, wanted)))
        return {metric: series for metric, series in answers.items() if series}

    def revision_range(self, *, deployment_id: int, revisions: list[int], metrics: list[str], start: float,
                       end: float, step: float) -> dict[tuple[int, str], list[list[float]]]:
        """revision_series.revision_series_range's answer: one `query_range` per metric over its tandem_revision:
        rule, bucketed as _range does (a point at t is the mean of the recorded samples in [t, t + step])."""
        wanted = [metric for metric in dict.fromkeys(metrics) if metric in REVISION_METRICS]
        deployment = _deployment_names([deployment_id]).get(deployment_id)
        if not wanted or not revisions or deployment is None:
            return {}
        num_buckets = max(math.ceil((end - start) / step), 1)
        numbers = "|".join(str(int(revision)) for revision in sorted(revisions))

        def read(metric: str) -> dict[tuple[int, str], list[list[float]]]:
            matrix = self.query_range_expr(
                f'avg_over_time({REVISION_PREFIX}{metric}{{deployment="{deployment}", revision=~"{numbers}"}}'
                f"[{_duration(step)}])", start=start + step, end=start + num_buckets * step, step=step)
            found = {}
            for item in matrix:
                points = [[start + (round((float(at) - start) / step) - 1) * step, value]
                          for at, value in ((at, _number(text)) for at, text in item["values"]) if value is not None]
                if points:
                    found[(int(item["metric"]["revision"]), metric)] = points
            return found

        with ThreadPoolExecutor(max_workers=min(RANGE_CONCURRENCY, len(wanted))) as pool:
            return {key: points for answer in pool.map(read, wanted) for key, points in answer.items()}

    # --- a gateway's counters ---------------------------------------------------------------------------------

    def gateway_revisions(self, gateway: Target) -> dict[str, Reading] | None:
        """The gateway's series that carry a `revision` label, as Prometheus last scraped them (one instant query),
        folded per revision by the embedded scrape's parser (exposition.parse_exposition), so that both backends
        count errors, client errors and buckets alike. None, as when the embedded backend's read of the gateway
        fails: its last scrape failed (`up` 0), or Prometheus has not scraped it (yet)."""
        names = _deployment_names([gateway.deployment_id])
        if gateway.deployment_id not in names:
            return None
        target = f'deployment="{names[gateway.deployment_id]}", pool="gateway", worker="{int(gateway.worker_id)}"'
        up, lines = None, []
        for item in self.query(f'{{{target}, revision!=""}} or up{{{target}}}', at=time.time()):
            if item["metric"].get("__name__") == "up":
                up = float(item["value"][1])
                continue
            lines.append(exposition_line(item["metric"], item["value"][1]))
        if up != 1.0:
            return None
        try:
            return parse_exposition("\n".join(lines) + "\n").by_revision
        except ValueError:  # none of the request metrics the parser reads (or no series at all): no revision yet
            return {}

    def gateway_counters(self, gateway: Target, *, start: float, end: float) -> list[dict]:
        """gateway_counters.scraped_counters of one range selector over the gateway's raw request series."""
        deployment = _deployment_names([gateway.deployment_id]).get(gateway.deployment_id)
        if deployment is None:
            return []
        matrix = self.query(range_selector(deployment, gateway.worker_id, start=start, end=end), at=end)
        return scraped_counters(matrix, start=start, end=end)

    # --- points over a range ----------------------------------------------------------------------------------

    def query_range(self, queries: list[SeriesQuery], *, now: float) -> list[tuple[str, list[dict]]]:
        """series.query_series_many's answer, from one `query_range` per distinct query (run RANGE_CONCURRENCY at
        a time: a page reads ~20 lines, whose round trips one after another would add up). The first query that
        fails fails the read: a page shows the error, not a chart with lines missing."""
        distinct = list(dict.fromkeys(queries))
        if not distinct:
            return []
        names = _deployment_names(sorted({query.deployment_id for query in distinct}))
        pool = ThreadPoolExecutor(max_workers=min(RANGE_CONCURRENCY, len(distinct)))
        try:
            answers = dict(zip(distinct, pool.map(lambda q: self._range(q, names.get(q.deployment_id)), distinct)))
        finally:
            # On the first failure the page answers at once: the queries not sent are dropped, and those in flight
            # end within their timeout without being waited for.
            pool.shutdown(wait=False, cancel_futures=True)
        return [("prometheus", answers[query]) for query in queries]

    def _range(self, query: SeriesQuery, deployment: str | None) -> list[dict]:
        """[{"deployment_id", "role", "worker_id", "points"}] of one query: `avg_over_time(<series>[step])` at the
        end of each bucket, its point put at the bucket's start, so that a point at t is the mean of the recorded
        samples in [t, t + step], as the embedded store's is of [t, t + step)."""
        selector = _range_selector(query, deployment)
        if selector is None:
            return []
        step = float(query.step)
        num_buckets = max(math.ceil((query.end - query.start) / step), 1)
        matrix = self.query_range_expr(f"avg_over_time({selector}[{_duration(step)}])",
                                       start=query.start + step, end=query.start + num_buckets * step, step=step)
        found = []
        for item in matrix:
            labels = item["metric"]
            wid = labels.get("worker")
            if query.worker is not None and not (wid or "").isdigit():
                continue
            points = []
            for at, text in item["values"]:
                value = _number(text)
                if value is not None:
                    bucket = round((float(at) - query.start) / step) - 1
                    points.append([query.start + bucket * step, value])
            if points:
                found.append({"deployment_id": query.deployment_id, "role": labels.get("pool", ""),
                              "worker_id": int(wid) if query.worker is not None else None, "points": points})
        return sorted(found, key=lambda entry: (entry["role"], entry["worker_id"] or 0))


def _range_selector(query: SeriesQuery, deployment: str | None) -> str | None:
    """The recorded series of a range query (SeriesQuery's scopes as label matchers); None when it selects none:
    no such deployment, a series without a recording rule, or an empty tuple of roles or workers."""
    if deployment is None or query.metric not in recorded_metrics():
        return None
    matchers = [f'deployment="{deployment}"']
    if isinstance(query.role, tuple):
        if not query.role:
            return None
        matchers.append(f'pool=~"{"|".join(sorted(query.role))}"')
    elif query.role is not None:
        matchers.append(f'pool="{query.role}"')
    if isinstance(query.worker, tuple):
        if not query.worker:
            return None
        matchers.append(f'worker=~"{"|".join(str(int(w)) for w in sorted(query.worker))}"')
    elif query.worker not in (None, "all"):
        matchers.append(f'worker="{int(query.worker)}"')
    prefix = POOL_PREFIX if query.worker is None else WORKER_PREFIX
    return f"{prefix}{query.metric}{{{', '.join(matchers)}}}"


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
