"""Celery tasks: thin wrappers around supervision services; they take ids.

Queue `control` (the default): reconcile and health, run by the control worker, scheduled by beat every
TANDEM_RECONCILE_INTERVAL_S and also enqueued right after every service call. Queue `node.<name>`: the agent tasks,
sent with `apply_async(queue=node.queue)` by controlplane.supervision.dispatch and run by that node's agent.
"""
from __future__ import annotations

import logging

from celery import Task, shared_task
from django.db import OperationalError

log = logging.getLogger(__name__)

# SQLite answers "database is locked" when a writer holds the lock past the busy timeout: retry a few times.
# ignore_result: nothing reads these results, and beat sends two tasks per interval that would fill the
# django-db result table forever.
_RETRY = dict(autoretry_for=(OperationalError,), retry_backoff=1, retry_backoff_max=10, max_retries=3,
              ignore_result=True)


@shared_task(**_RETRY)
def reconcile_deployment(deployment_id: int) -> dict:
    from controlplane.supervision.reconcile import reconcile_deployment as reconcile

    return reconcile(deployment_id)


@shared_task(**_RETRY)
def reconcile_all() -> int:
    from controlplane.models import Deployment
    from controlplane.supervision.reconcile import reconcile_deployment as reconcile

    ids = list(Deployment.objects.values_list("id", flat=True))
    for deployment_id in ids:
        try:
            reconcile(deployment_id)
        except Exception:
            # One broken deployment must not stop the others from being reconciled.
            log.exception("reconcile of deployment %s failed", deployment_id)
    return len(ids)


@shared_task(**_RETRY)
def check_health() -> dict:
    from controlplane.supervision.health import check_health as check

    return check()


def _agent_node_name() -> str | None:
    from controlplane.agent import runtime

    return runtime.node_name


class AgentStartTask(Task):
    def on_failure(self, exc, task_id, args, kwargs, einfo):
        """A start that raised after its claim leaves a `starting` row without a process: hand it to the restart
        policy, so that it is retried with backoff (and given up on after too many tries) instead of stuck."""
        from controlplane.models import WorkerStatus
        from controlplane.supervision.restarts import worker_record_failure

        worker_id = args[0] if args else kwargs.get("worker_id")
        worker_record_failure(worker_id=worker_id, expected_pid=None, from_statuses=(WorkerStatus.STARTING,),
                              reason=f"the node agent failed to start it: {exc!r}")


@shared_task(bind=True, base=AgentStartTask, **_RETRY)
def agent_start_worker(self, worker_id: int) -> str:
    from controlplane.agent.workers import worker_start

    return worker_start(worker_id=worker_id, node_name=_agent_node_name())


@shared_task(bind=True, **_RETRY)
def agent_stop_worker(self, worker_id: int, deadline_s: float) -> str:
    from controlplane.agent.workers import worker_stop

    return worker_stop(worker_id=worker_id, node_name=_agent_node_name(), deadline_s=deadline_s)
