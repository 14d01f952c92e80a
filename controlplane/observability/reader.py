"""The seam between everything that reads series and the metrics backend: alert rule evaluation, the autoscaler,
chaos hypothesis checks, rollout analysis, the capacity planner's live inputs, the deployment page's charts and stage
columns, the rollout page's per-revision charts, the fleet overview's headlines and `GET /api/v1/metrics/query` read
through `reader()`, and nothing else knows which backend is in use.

    reader().metric_values(metric=..., deployments=ids, role=..., aggregation="max", window_s=60, now=t)
    reader().latest_pool_values(deployment_ids=ids, metrics=names, window_s=15, now=t, roles=roles)
    reader().tenant_metric_values(metric=..., tenant="acme", deployments=ids, aggregation="max", window_s=60, now=t)
    reader().tenant_range(tenant="acme", metrics=names, start=s, end=e, step=auto_step(s, e))
        metric → [{"deployment_id", "points"}]: a tenant's series per deployment (the tenant page's charts)
    reader().query_range([SeriesQuery(metric=..., deployment_id=..., role=..., worker=..., start=, end=,
                                      step=auto_step(start, end)), ...], now=t)
        per query (source, [{"deployment_id", "role", "worker_id", "points": [[t, value], ...]}]): one point per
        step, the mean of the series over [t, t + step); the charts' read (series.query_series_many's contract)
    reader().revision_range(deployment_id=pk, revisions=[1, 2], metrics=names, start=s, end=e, step=auto_step(s, e))
        (revision, metric) → points: a gateway's series per revision (the rollout and A/B pages' charts)
    reader().gateway_revisions(Target(gateway id, deployment id, "gateway", url))
        {revision: Reading} of the gateway's cumulative request counters and histograms: rollout analysis
        (embedded: the gateway's /metrics, read at once; prometheus: its series as last scraped)
    reader().gateway_counters(Target(gateway id, ...), start=t0, end=t1)
        [{"ts", "snapshot"}]: the gateway's cumulative request counters and latency histograms at each scrape of the
        window, led by the one that opens it (gateway_counters.py): chaos reads a fault's window as their increase

TANDEM_METRICS_BACKEND picks the implementation: "embedded" (the default) reads Tandem's own tables
(observability.series); "prometheus" issues PromQL instant and range queries over the recording rules
(observability.promql).

A backend that cannot answer (unreachable, timed out, or an error answer such as a refused PromQL query) raises
MetricsUnavailable, with a message that says which. The loops then hold still: the evaluator makes no alert
transition and the autoscaler no scale in that pass (missing data is not "below the threshold", and an alert that
resolves because its data went away would page again once it is back); /healthz says so (problem()); a page draws
each chart as that error, never as an empty chart, and the query API answers 503 with it.
"""
from __future__ import annotations

import logging
from typing import Protocol

from django.conf import settings

from controlplane.observability import revision_series, series, tenant_series
from controlplane.observability.promql import MetricsUnavailable, PrometheusReader
from controlplane.observability.exposition import Reading
from controlplane.observability.gateway_counters import stored_counters
from controlplane.observability.scraper import Target, scrape
from controlplane.observability.series import MetricValue, SeriesQuery

__all__ = ["EmbeddedReader", "MetricsUnavailable", "SeriesReader", "reader"]

log = logging.getLogger(__name__)


class SeriesReader(Protocol):
    name: str

    def metric_values(self, *, metric: str, deployment=None, role: str | None = None, worker=None,
                      aggregation: str = "avg", window_s: float = 60, offset_s: float = 0, now=None,
                      per_worker: bool = False, deployments: list[int] | None = None) -> list[MetricValue]:
        """One value per series over the window (series.metric_values has the contract)."""

    def latest_pool_values(self, *, deployment_ids, metrics, window_s: float, now: float,
                           roles=None) -> dict[tuple[int, str, str], float]:
        """(deployment id, role, metric) → the newest pool value in the window (series.latest_pool_values)."""

    def query_range(self, queries: list[SeriesQuery], *, now: float) -> list[tuple[str, list[dict]]]:
        """Points over a range per query, in order (series.query_series_many has the contract)."""

    def tenant_metric_values(self, *, metric: str, tenant: str, deployments: list[int] | None = None,
                             aggregation: str = "avg", window_s: float = 60, offset_s: float = 0,
                             now=None) -> list[MetricValue]:
        """One value per deployment of a tenant's series (tenant_series.tenant_metric_values has the contract)."""

    def tenant_range(self, *, tenant: str, metrics: list[str], start: float, end: float,
                     step: float) -> dict[str, list[dict]]:
        """A tenant's series per deployment over a range (tenant_series.tenant_series_range has the contract)."""

    def revision_range(self, *, deployment_id: int, revisions: list[int], metrics: list[str], start: float,
                       end: float, step: float) -> dict[tuple[int, str], list[list[float]]]:
        """A deployment's per-revision series over a range (revision_series.revision_series_range has the
        contract)."""

    def gateway_revisions(self, gateway: Target) -> dict[str, Reading] | None:
        """A gateway's cumulative request counters and latency histograms per revision that it served
        (Reading.by_revision: what rollout analysis compares), as of now; None when it has none to give."""

    def gateway_counters(self, gateway: Target, *, start: float, end: float) -> list[dict]:
        """A gateway's counters at each of its scrapes in (start, end], led by the newest at or before `start`
        (gateway_counters.py has the contract)."""

    def problem(self) -> str | None:
        """Why the backend cannot answer now, or None (for /healthz; cheap, cached)."""


class EmbeddedReader:
    """Tandem's own tables, filled by its scrape cycle."""

    name = "embedded"

    def metric_values(self, **kwargs) -> list[MetricValue]:
        return series.metric_values(**kwargs)

    def latest_pool_values(self, **kwargs) -> dict[tuple[int, str, str], float]:
        return series.latest_pool_values(**kwargs)

    def tenant_metric_values(self, **kwargs) -> list[MetricValue]:
        return tenant_series.tenant_metric_values(**kwargs)

    def tenant_range(self, **kwargs) -> dict[str, list[dict]]:
        return tenant_series.tenant_series_range(**kwargs)

    def query_range(self, queries: list[SeriesQuery], *, now: float) -> list[tuple[str, list[dict]]]:
        return series.query_series_many(queries, now=now)

    def revision_range(self, **kwargs) -> dict[tuple[int, str], list[list[float]]]:
        return revision_series.revision_series_range(**kwargs)

    def gateway_revisions(self, gateway: Target) -> dict[str, Reading] | None:
        # The store keeps rates, not the counters' totals: read the gateway itself, as the scrape cycle does.
        fetched = scrape([gateway], timeout_s=settings.TANDEM_SCRAPE_TIMEOUT_S, concurrency=1)[0]
        if fetched.reading is None:
            log.info("gateway %s did not answer: %s", gateway.worker_id, fetched.error)
            return None
        return fetched.reading.by_revision

    def gateway_counters(self, gateway: Target, *, start: float, end: float) -> list[dict]:
        return stored_counters(gateway.worker_id, gateway.deployment_id, start=start, end=end)

    def problem(self) -> str | None:
        return None  # the database: /healthz checks it first


_readers: dict[tuple, SeriesReader] = {}


def reader() -> SeriesReader:
    """The configured backend's reader (one per process and configuration: the Prometheus one keeps a session)."""
    key = (settings.TANDEM_METRICS_BACKEND, settings.TANDEM_PROMETHEUS_URL, settings.TANDEM_PROMETHEUS_TIMEOUT_S)
    if key not in _readers:
        if key[0] == "prometheus":
            _readers[key] = PrometheusReader(url=key[1], timeout_s=key[2])
        else:
            _readers[key] = EmbeddedReader()
    return _readers[key]
