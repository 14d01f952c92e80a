"""Celery tasks of the observability app (queue `control`; beat entries in apps.py). Thin wrappers over services."""
from __future__ import annotations

import logging
import time

from celery import shared_task

from controlplane.observability.models import CycleKind

log = logging.getLogger(__name__)


@shared_task(name="observability.scrape_cycle", ignore_result=True)
def scrape_cycle_task() -> dict:
    """Scrape every target, store the series, then evaluate the autoscaler on them (one pass each)."""
    return run_cycle()


def run_cycle() -> dict:
    from controlplane.observability.autoscaler import autoscale_all
    from controlplane.observability.store import scrape_cycle
    from controlplane.observability.telemetry import record_cycle

    started = time.perf_counter()
    result = scrape_cycle()
    scrape_seconds = time.perf_counter() - started
    record_cycle(CycleKind.SCRAPE, scrape_seconds, num_targets=result.num_targets, num_up=result.num_up)
    started = time.perf_counter()
    decisions = autoscale_all()
    autoscale_seconds = time.perf_counter() - started
    record_cycle(CycleKind.AUTOSCALE, autoscale_seconds)
    return {"targets": result.num_targets, "up": result.num_up, "samples": result.num_samples,
            "scrape_seconds": scrape_seconds, "autoscale_seconds": autoscale_seconds,
            "num_scaled": sum(1 for _, d in decisions if d is not None and d.changes)}


@shared_task(name="observability.rollup_and_prune", ignore_result=True)
def rollup_and_prune_task() -> dict:
    from controlplane.observability.rollup import prune, rollup_pending
    from controlplane.observability.telemetry import record_cycle

    started = time.perf_counter()
    num_rollups = rollup_pending()
    deleted = prune()
    record_cycle(CycleKind.ROLLUP, time.perf_counter() - started)
    return {"rollups": num_rollups, "deleted": deleted}
