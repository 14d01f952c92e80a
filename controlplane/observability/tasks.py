"""Celery tasks of the observability app (queue `periodic`; beat entries in apps.py). Thin wrappers over services."""
from __future__ import annotations

import logging
import time

from celery import shared_task
from django.conf import settings

from controlplane.observability.models import CycleKind
from controlplane.observability.rollup import prune, rollup_pending
from controlplane.observability.store import Shard, scrape_cycle
from controlplane.observability.telemetry import record_cycle
from controlplane.lib.single_pass import single_pass

log = logging.getLogger(__name__)
_said_not_scraping = False


@shared_task(name="observability.scrape_cycle", ignore_result=True)
def scrape_cycle_task(shard: int = 0, shards: int = 1) -> dict:
    """Scrape every target of the shard's deployments and store the series (one pass), timed for the control
    plane's /metrics; none while another pass of the same shard runs (single_pass: two would only slow each other
    down). Shards (settings.TANDEM_SCRAPE_SHARDS) run side by side, on whichever periodic workers take them."""
    global _said_not_scraping
    if settings.TANDEM_METRICS_BACKEND == "prometheus":
        if not _said_not_scraping:  # once per process, not every 5 s
            log.info("not scraping: TANDEM_METRICS_BACKEND=prometheus (Prometheus at %s scrapes the fleet)",
                     settings.TANDEM_PROMETHEUS_URL)
            _said_not_scraping = True
        return {"skipped": "TANDEM_METRICS_BACKEND=prometheus: Prometheus scrapes"}
    part = Shard(shard, shards)
    with single_pass(CycleKind.SCRAPE if shards == 1 else f"{CycleKind.SCRAPE}.{shard}.{shards}") as mine:
        if not mine:
            return {"skipped": "another scrape pass is running"}
        started = time.perf_counter()
        result = scrape_cycle(shard=part)
        seconds = time.perf_counter() - started
    record_cycle(CycleKind.SCRAPE, seconds, num_targets=result.num_targets, num_up=result.num_up, shard=part)
    return {"targets": result.num_targets, "up": result.num_up, "samples": result.num_samples,
            "scrape_seconds": seconds}


@shared_task(name="observability.rollup_and_prune", ignore_result=True)
def rollup_and_prune_task() -> dict:
    started = time.perf_counter()
    num_rollups = rollup_pending()
    deleted = prune()
    record_cycle(CycleKind.ROLLUP, time.perf_counter() - started)
    return {"rollups": num_rollups, "deleted": deleted}
