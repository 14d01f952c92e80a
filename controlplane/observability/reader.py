"""The seam between the control loops and the metrics backend: alert rule evaluation, the autoscaler and chaos
hypothesis checks read series through `reader()`, and nothing else knows which backend is in use.

    reader().metric_values(metric=..., deployments=ids, role=..., aggregation="max", window_s=60, now=t)
    reader().latest_pool_values(deployment_ids=ids, metrics=names, window_s=15, now=t, roles=roles)

TANDEM_METRICS_BACKEND picks the implementation: "embedded" (the default) reads Tandem's own tables
(observability.series); "prometheus" issues PromQL instant queries over the recording rules (observability.promql).

A backend that cannot answer raises MetricsUnavailable. The loops then hold still: the evaluator makes no alert
transition and the autoscaler no scale in that pass (missing data is not "below the threshold", and an alert that
resolves because its data went away would page again once it is back); /healthz says so (problem()).

Not through the seam yet: the deployment and overview pages' charts and stage columns, the query API
(query_range), rollout analysis and the capacity planner read the embedded store directly.
"""
from __future__ import annotations

from typing import Protocol

from django.conf import settings

from controlplane.observability import series
from controlplane.observability.promql import MetricsUnavailable, PrometheusReader
from controlplane.observability.series import MetricValue

__all__ = ["EmbeddedReader", "MetricsUnavailable", "SeriesReader", "reader"]


class SeriesReader(Protocol):
    name: str

    def metric_values(self, *, metric: str, deployment=None, role: str | None = None, worker=None,
                      aggregation: str = "avg", window_s: float = 60, offset_s: float = 0, now=None,
                      per_worker: bool = False, deployments: list[int] | None = None) -> list[MetricValue]:
        """One value per series over the window (series.metric_values has the contract)."""

    def latest_pool_values(self, *, deployment_ids, metrics, window_s: float, now: float,
                           roles=None) -> dict[tuple[int, str, str], float]:
        """(deployment id, role, metric) → the newest pool value in the window (series.latest_pool_values)."""

    def problem(self) -> str | None:
        """Why the backend cannot answer now, or None (for /healthz; cheap, cached)."""


class EmbeddedReader:
    """Tandem's own tables, filled by its scrape cycle."""

    name = "embedded"

    def metric_values(self, **kwargs) -> list[MetricValue]:
        return series.metric_values(**kwargs)

    def latest_pool_values(self, **kwargs) -> dict[tuple[int, str, str], float]:
        return series.latest_pool_values(**kwargs)

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
