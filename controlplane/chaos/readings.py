"""What a hypothesis is judged on, read from Tandem itself: the deployment gateway's cumulative counters (sampled by
the driver every pass into GatewaySample), the ready Worker rows of a pool, and the observability app's stored
series of a pool (observability.reader: the reader alert rules use, of either metrics backend)."""
from __future__ import annotations

import logging
import re
import time

import requests
from django.conf import settings

from controlplane.chaos.hypothesis import gateway_window
from controlplane.chaos.models import GatewaySample
from controlplane.chaos.validation import GATEWAY_METRICS, READY_WORKERS
from controlplane.lib.worker_keys import scrape_headers
from controlplane.models import Worker, WorkerRole, WorkerStatus
from controlplane.observability.exposition import parse_exposition
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.rollouts.analysis import snapshot_of

log = logging.getLogger(__name__)

# Samples older than this are pruned: the longest check window (validation.MAX_WINDOW_S) plus a margin.
SAMPLE_KEEP_S = 180.0
_EXTRA_COUNTERS = {"m": re.compile(r"^tandem_request_migrations_total(\{[^}]*\})?\s+(\S+)", re.M),
                   "r": re.compile(r"^tandem_gateway_retries_total(\{[^}]*\})?\s+(\S+)", re.M)}


def gateway_of(deployment_id: int) -> Worker | None:
    return (Worker.objects.filter(deployment_id=deployment_id, role=WorkerRole.GATEWAY, port__isnull=False,
                                  status__in=(WorkerStatus.STARTING, WorkerStatus.READY))
            .order_by("-id").first())


def gateway_snapshot(deployment_id: int) -> dict | None:
    """The gateway's cumulative request counters now (summed over revisions), or None when it does not answer."""
    gateway = gateway_of(deployment_id)
    if gateway is None:
        return None
    try:
        response = requests.get(f"{gateway.url}/metrics", timeout=settings.TANDEM_SCRAPE_TIMEOUT_S,
                                headers=scrape_headers())
        response.raise_for_status()
        text = response.text
        snapshot = snapshot_of(parse_exposition(text))
    except (requests.RequestException, ValueError) as exc:
        log.info("chaos: the gateway of deployment %s did not answer: %r", deployment_id, exc)
        return None
    for key, pattern in _EXTRA_COUNTERS.items():
        snapshot[key] = sum(float(match.group(2)) for match in pattern.finditer(text))
    return snapshot


def sample_gateway(deployment_id: int, *, now: float | None = None) -> bool:
    """Record one GatewaySample of the deployment (False when the gateway did not answer)."""
    snapshot = gateway_snapshot(deployment_id)
    if snapshot is None:
        return False
    GatewaySample.objects.create(deployment_id=deployment_id, ts=time.time() if now is None else now,
                                 snapshot=snapshot)
    return True


def samples_prune(*, now: float | None = None) -> int:
    cutoff = (time.time() if now is None else now) - SAMPLE_KEEP_S
    deleted, _ = GatewaySample.objects.filter(ts__lt=cutoff).delete()
    return deleted


def samples_of(deployment_id: int, *, since: float) -> list[dict]:
    """The deployment's samples from `since` on, oldest first, with the newest one before it (a window's start)."""
    before = (GatewaySample.objects.filter(deployment_id=deployment_id, ts__lt=since).order_by("-ts")
              .values("ts", "snapshot").first())
    rows = list(GatewaySample.objects.filter(deployment_id=deployment_id, ts__gte=since).order_by("ts")
                .values("ts", "snapshot"))
    return ([before] if before else []) + rows


def ready_workers(deployment_id: int, role: str) -> int:
    return Worker.objects.filter(deployment_id=deployment_id, role=role, status=WorkerStatus.READY).count()


def check_values(deployment_id: int, checks: list[dict], *, now: float, since: float | None = None) -> list:
    """One value per check (None: no data): gateway metrics over the check's window (from `since` at the earliest),
    ready workers now, a stored series of a pool over its window."""
    windows = [check["window_s"] for check in checks if check["metric"] in GATEWAY_METRICS]
    samples = samples_of(deployment_id, since=now - max(windows)) if windows else []
    values = []
    for check in checks:
        metric = check["metric"]
        if metric in GATEWAY_METRICS:
            numbers = gateway_window(samples, now=now, window_s=check["window_s"], since=since)
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
