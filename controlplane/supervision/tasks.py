"""Celery tasks of supervision (reconcile_deployment on queue `control`, the beat passes on `periodic`): thin
wrappers; they take ids.

Beat schedules reconcile_all and check_health every TANDEM_RECONCILE_INTERVAL_S; services also enqueue a
reconcile of one deployment (or one shared gateway) right after every change (by name: controlplane.celery.task_send).
"""
from __future__ import annotations

import logging
import time

from celery import shared_task
from django.conf import settings
from django.db import OperationalError

from controlplane.celery import CHECK_HEALTH, RECONCILE_ALL, RECONCILE_DEPLOYMENT, RECONCILE_SHARED_GATEWAY
from controlplane.models import Deployment, SharedGateway
from controlplane.observability.models import CycleKind
from controlplane.observability.telemetry import record_cycle
from controlplane.lib.single_pass import single_pass
from controlplane.supervision import health, reconcile, shared_gateways
from controlplane.supervision.at_rest import deployments_at_rest

log = logging.getLogger(__name__)

# SQLite answers "database is locked" when a writer holds the lock past the busy timeout: retry a few times.
# ignore_result: nothing reads these results, and beat sends two tasks per interval that would fill the
# django-db result table forever.
RETRY = dict(autoretry_for=(OperationalError,), retry_backoff=1, retry_backoff_max=10, max_retries=3,
             ignore_result=True)


@shared_task(name=RECONCILE_DEPLOYMENT, **RETRY)
def reconcile_deployment(deployment_id: int) -> dict:
    return reconcile.reconcile_deployment(deployment_id)


@shared_task(name=RECONCILE_SHARED_GATEWAY, **RETRY)
def reconcile_shared_gateway(gateway_id: int) -> dict:
    return shared_gateways.reconcile_shared_gateway(gateway_id)


# Every deployment, even one at rest, is reconciled at least this often: a safety net under the at-rest check.
FULL_PASS_EVERY_S = 60.0


def _at_rest_turn(ids: list[int], now: float) -> set[int]:
    """The deployments a pass reconciles even at rest: one slice of them per interval (by id, by wall-clock turn),
    so that each gets its turn once per FULL_PASS_EVERY_S and no single pass carries all of them (at fifty
    deployments one pass of all of them took two cycles, the only pass that missed the cycle at 250 workers)."""
    interval = float(settings.TANDEM_RECONCILE_INTERVAL_S)
    num_slices = max(1, round(FULL_PASS_EVERY_S / interval))
    turn = int(now // interval) % num_slices
    return {deployment_id for deployment_id in ids if deployment_id % num_slices == turn}


@shared_task(name=RECONCILE_ALL, **RETRY)
def reconcile_all() -> int:
    """Reconcile every deployment not at rest (supervision.at_rest) and those whose turn it is (_at_rest_turn), and
    every shared gateway, timed
    for the control plane's /metrics; none while another pass runs (single_pass). A deployment whose row another
    reconcile holds is skipped: that one is reconciling it. Returns how many were reconciled."""
    with single_pass(CycleKind.RECONCILE) as mine:
        return _reconcile_all() if mine else 0


def _reconcile_all() -> int:
    started = time.perf_counter()
    ids = list(Deployment.objects.values_list("id", flat=True))
    at_rest, turn = deployments_at_rest(ids), _at_rest_turn(ids, time.time())
    ids = [deployment_id for deployment_id in ids if deployment_id not in at_rest or deployment_id in turn]
    for deployment_id in ids:
        try:
            reconcile.reconcile_deployment(deployment_id, skip_locked=True)
        except Exception:
            # One broken deployment must not stop the others from being reconciled.
            log.exception("reconcile of deployment %s failed", deployment_id)
    # Every pass: there are few of them, and each is one row to compare.
    for gateway_id in SharedGateway.objects.values_list("id", flat=True):
        try:
            shared_gateways.reconcile_shared_gateway(gateway_id)
        except Exception:
            log.exception("reconcile of shared gateway %s failed", gateway_id)
    record_cycle(CycleKind.RECONCILE, time.perf_counter() - started)
    return len(ids)


@shared_task(name=CHECK_HEALTH, **RETRY)
def check_health() -> dict:
    """One health pass over every worker, timed for the control plane's /metrics (none while another runs)."""
    with single_pass(CycleKind.HEALTH) as mine:
        if not mine:
            return {"skipped": ["another health pass is running"]}
        started = time.perf_counter()
        result = health.check_health()
        record_cycle(CycleKind.HEALTH, time.perf_counter() - started)
        return result
