"""What a hypothesis is judged on, read from Tandem itself: the deployment gateway's cumulative counters at each of
its scrapes and the stored series of a pool, both through observability.reader (the reader alert rules use, of
either metrics backend), and the ready Worker rows of a pool.

A gateway's numbers over a window are the increases between two scrapes (hypothesis.gateway_window), so a window is
never shorter than the scrape interval (TANDEM_SCRAPE_INTERVAL_S, Prometheus' too: docs/prometheus.md): a check or
an abort condition with a shorter `window_s` is read over the interval instead, and the run's report says so
(widened)."""
from __future__ import annotations

import logging

from django.conf import settings

from controlplane.chaos.hypothesis import gateway_window
from controlplane.chaos.validation import GATEWAY_METRICS, READY_WORKERS
from controlplane.models import Worker, WorkerStatus
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.observability.store import gateway_target

log = logging.getLogger(__name__)


def gateway_scrapes(deployment_id: int, *, start: float, end: float) -> list[dict]:
    """The deployment gateway's counters at its scrapes in (start, end], led by the newest one at or before `start`
    (observability.gateway_counters has the shape). Empty without a gateway, or when the metrics backend does not
    answer: no data, which never passes a check (the driver still reverts on time)."""
    gateway = gateway_target(deployment_id)  # its own, or the shared gateway it is attached to
    if gateway is None:
        return []
    try:
        return reader().gateway_counters(gateway, start=start, end=end)
    except MetricsUnavailable as exc:
        log.warning("chaos: the gateway counters of deployment %s unread: %s", deployment_id, exc)
        return []


def read_window_s(check: dict) -> float:
    """The window a gateway metric's check is read over: its own, or the scrape interval when that is longer."""
    return max(float(check["window_s"]), float(settings.TANDEM_SCRAPE_INTERVAL_S))


def widened(spec: dict) -> list[str]:
    """One sentence for each of an experiment's gateway windows (checks, abort conditions, the faults' duration) that
    is shorter than the scrape interval, and so is read over the interval."""
    interval = float(settings.TANDEM_SCRAPE_INTERVAL_S)
    lines = [f"{where}[{index}] {check['metric']}: its window of {check['window_s']:g} s is read over "
             f"{interval:g} s, the scrape interval"
             for where in ("hypothesis", "abort_conditions")
             for index, check in enumerate(spec.get(where) or [])
             if check["metric"] in GATEWAY_METRICS and check["window_s"] < interval]
    if spec.get("duration_s") is not None and spec["duration_s"] < interval:
        lines.append(f"the faults last {spec['duration_s']:g} s, less than the scrape interval of {interval:g} s: "
                     "the gateway's numbers of the fault are read over the scrapes around it")
    return lines


def ready_workers(deployment_id: int, role: str) -> int:
    return Worker.objects.filter(deployment_id=deployment_id, role=role, status=WorkerStatus.READY).count()


def check_values(deployment_id: int, checks: list[dict], *, now: float, since: float | None = None) -> list:
    """One value per check (None: no data): gateway metrics over the check's window (read_window_s; from `since` at
    the earliest), ready workers now, a stored series of a pool over its window."""
    windows = [read_window_s(check) for check in checks if check["metric"] in GATEWAY_METRICS]
    scrapes = gateway_scrapes(deployment_id, start=now - max(windows), end=now) if windows else []
    values = []
    for check in checks:
        metric = check["metric"]
        if metric in GATEWAY_METRICS:
            numbers = gateway_window(scrapes, now=now, window_s=read_window_s(check), since=since)
            values.append(None if numbers is None else numbers.get(metric))
        elif metric == READY_WORKERS:
            values.append(float(ready_workers(deployment_id, check["role"])))
        else:
            window = check["window_s"] if since is None else min(check["window_s"], max(now - since, 1.0))
            try:
                series = reader().metric_values(metric=metric, deployment=deployment_id, role=check["role"],
                                                aggregation=check["aggregation"], window_s=window, now=now)
            except MetricsUnavailable as exc:
                # No data (which never passes a check), not a failed pass: the driver still reverts on time.
                log.warning("chaos: %s of deployment %s unread: %s", metric, deployment_id, exc)
                series = []
            values.append(next((v.value for v in series if v.worker_id is None), None))
    return values
