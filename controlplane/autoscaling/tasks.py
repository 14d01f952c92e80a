"""Celery task of the autoscaler (queue `periodic`; beat entry in apps.py). A thin wrapper over autoscale_all."""
from __future__ import annotations

import time

from celery import shared_task

from controlplane.autoscaling.autoscaler import autoscale_all
from controlplane.observability.models import CycleKind
from controlplane.observability.telemetry import record_cycle
from controlplane.lib.single_pass import single_pass


@shared_task(name="autoscaling.autoscale_cycle", ignore_result=True)
def autoscale_cycle_task() -> dict:
    """One evaluation of every pool whose deployment has autoscaling on, timed for the control plane's /metrics."""
    with single_pass(CycleKind.AUTOSCALE) as mine:
        if not mine:
            return {"skipped": "another autoscaling pass is running"}
        started = time.perf_counter()
        decisions = autoscale_all()
        seconds = time.perf_counter() - started
    record_cycle(CycleKind.AUTOSCALE, seconds)
    return {"pools": len(decisions), "autoscale_seconds": seconds,
            "num_scaled": sum(1 for _, d in decisions if d is not None and d.changes)}
