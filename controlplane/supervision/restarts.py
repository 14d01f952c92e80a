"""Restart policy: a worker that died or stopped answering /health is restarted with exponential backoff; after
TANDEM_MAX_RESTARTS restarts within TANDEM_RESTART_WINDOW_S it is left `failed` and an action row says so.

A restart is in place (the same Worker row, restart_count + 1): the row goes back to `pending` with
`next_restart_at` in the future, and reconcile hands it to its node agent once that time has come. The restarts in
the window are counted from the audit log (system restart actions of that worker), not from a second counter.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.models import Action, ActionKind, ActionStatus, ActorType, Worker, WorkerStatus

log = logging.getLogger(__name__)

SYSTEM_ACTOR = "supervisor"


def backoff_seconds(num_recent_restarts: int) -> int:
    """1, 2, 4, ... seconds before the next start, capped by TANDEM_RESTART_BACKOFF_MAX_S."""
    return min(2 ** min(num_recent_restarts, 30), settings.TANDEM_RESTART_BACKOFF_MAX_S)


def worker_record_failure(*, worker_id: int, expected_pid: int | None, from_statuses, reason: str) -> str | None:
    """Restart (or give up on) a worker that failed. Returns "restart", "fail", or None when another process got
    there first (the row is no longer in from_statuses with that pid: it was already handled).

    1. Lock the row; bail out unless it is still the failure we saw (status and pid unchanged).
    2. Count this worker's system restarts inside the window (the audit log is the counter).
    3. Below the limit: back to pending with a backoff, a `restart` action (running until the worker is ready).
       At the limit: `failed`, a `fail` action, and any running restart action of it fails too.
    """
    now = timezone.now()
    with transaction.atomic():
        worker = Worker.objects.select_for_update(of=("self",)).select_related("deployment").filter(id=worker_id).first()
        if worker is None or worker.status not in from_statuses or worker.pid != expected_pid:
            return None
        window_start = now - timedelta(seconds=settings.TANDEM_RESTART_WINDOW_S)
        recent = Action.objects.filter(
            worker=worker, kind=ActionKind.RESTART, actor_type=ActorType.SYSTEM, created_at__gte=window_start,
        )
        num_recent = recent.count()
        common = dict(
            deployment=worker.deployment, deployment_name=worker.deployment.name, worker=worker,
            actor_type=ActorType.SYSTEM, actor=SYSTEM_ACTOR, started_at=now,
        )
        if num_recent >= settings.TANDEM_MAX_RESTARTS:
            message = (f"{reason}; gave up after {num_recent} restarts within "
                       f"{settings.TANDEM_RESTART_WINDOW_S} s")
            Worker.objects.filter(id=worker.id).update(
                status=WorkerStatus.FAILED, last_error=message, stopped_at=now, next_restart_at=None,
            )
            Action.objects.filter(worker=worker, kind=ActionKind.RESTART, status__in=(
                ActionStatus.PENDING, ActionStatus.RUNNING)).update(
                status=ActionStatus.FAILED, error=message, finished_at=now)
            Action.objects.create(kind=ActionKind.FAIL, reason=message, status=ActionStatus.SUCCEEDED,
                                  finished_at=now, params={"role": worker.role, "pid": expected_pid,
                                                           "num_restarts_in_window": num_recent}, **common)
            log.error("worker %s (%s) failed: %s", worker.id, worker.role, message)
            return "fail"
        delay = backoff_seconds(num_recent)
        first_in_window = recent.order_by("created_at").values_list("created_at", flat=True).first()
        Worker.objects.filter(id=worker.id).update(
            status=WorkerStatus.PENDING, last_error=reason, next_restart_at=now + timedelta(seconds=delay),
            restart_count=worker.restart_count + 1, consecutive_health_failures=0, ready_at=None,
            restart_window_started_at=first_in_window or now,
        )
        Action.objects.create(kind=ActionKind.RESTART, reason=reason, status=ActionStatus.RUNNING,
                              params={"role": worker.role, "pid": expected_pid, "backoff_s": delay,
                                      "restart_count": worker.restart_count + 1}, **common)
        deployment_id = worker.deployment_id
        transaction.on_commit(lambda: _reconcile_later(deployment_id, delay))
    log.warning("worker %s (%s) restarts in %d s: %s", worker_id, worker.role, delay, reason)
    return "restart"


def worker_restart_actions_finish(*, worker_id: int, succeeded: bool, error: str = "") -> None:
    """Close the running restart actions of a worker once it is ready again (or gave up)."""
    Action.objects.filter(worker_id=worker_id, kind=ActionKind.RESTART, status=ActionStatus.RUNNING).update(
        status=ActionStatus.SUCCEEDED if succeeded else ActionStatus.FAILED, error=error,
        finished_at=timezone.now(),
    )


def _reconcile_later(deployment_id: int, delay_s: int) -> None:
    from controlplane.tasks import reconcile_deployment

    # Beat's periodic reconcile would also get there; this just makes the restart happen right after the backoff.
    reconcile_deployment.apply_async(args=(deployment_id,), countdown=delay_s + 0.1)
