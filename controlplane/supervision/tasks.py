"""Celery tasks of the `control` queue: thin wrappers around supervision; they take ids.

Beat schedules reconcile_all and check_health every TANDEM_RECONCILE_INTERVAL_S; services also enqueue a
reconcile of one deployment right after every change (by name: controlplane.celery.task_send).
"""
from __future__ import annotations

import logging
import time

from celery import shared_task
from django.db import OperationalError

from controlplane.celery import CHECK_HEALTH, RECONCILE_ALL, RECONCILE_DEPLOYMENT
from controlplane.models import Deployment
from controlplane.observability.models import CycleKind
from controlplane.observability.telemetry import record_cycle
from controlplane.supervision import health, reconcile

log = logging.getLogger(__name__)

# SQLite answers "database is locked" when a writer holds the lock past the busy timeout: retry a few times.
# ignore_result: nothing reads these results, and beat sends two tasks per interval that would fill the
# django-db result table forever.
RETRY = dict(autoretry_for=(OperationalError,), retry_backoff=1, retry_backoff_max=10, max_retries=3,
             ignore_result=True)


@shared_task(name=RECONCILE_DEPLOYMENT, **RETRY)
def reconcile_deployment(deployment_id: int) -> dict:
    return reconcile.reconcile_deployment(deployment_id)


@shared_task(name=RECONCILE_ALL, **RETRY)
def reconcile_all() -> int:
    """Reconcile every deployment, timed for the control plane's /metrics."""
    started = time.perf_counter()
    ids = list(Deployment.objects.values_list("id", flat=True))
    for deployment_id in ids:
        try:
            reconcile.reconcile_deployment(deployment_id)
        except Exception:
            # One broken deployment must not stop the others from being reconciled.
            log.exception("reconcile of deployment %s failed", deployment_id)
    record_cycle(CycleKind.RECONCILE, time.perf_counter() - started)
    return len(ids)


@shared_task(name=CHECK_HEALTH, **RETRY)
def check_health() -> dict:
    """One health pass over every worker, timed for the control plane's /metrics."""
    started = time.perf_counter()
    result = health.check_health()
    record_cycle(CycleKind.HEALTH, time.perf_counter() - started)
    return result
