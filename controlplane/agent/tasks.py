"""Celery tasks of a node's queue `node.<name>`, run by that node's agent: start and stop one worker's process.

They are sent by supervision (controlplane.supervision.node_queue) by name, with the node's queue. What happens to
a process is reported as data (controlplane.services.restarts); the agent never decides the policy.
"""
from __future__ import annotations

from celery import Task, shared_task
from django.db import OperationalError

from controlplane.agent import runtime
from controlplane.agent.faults import AGENT_FAULT_INJECT, AGENT_FAULT_REVERT, fault_inject, fault_revert
from controlplane.agent.host import host_measure
from controlplane.agent.workers import worker_start, worker_stop
from controlplane.celery import AGENT_START_WORKER, AGENT_STOP_WORKER
from controlplane.services.nodes import AGENT_MEASURE_HOST
from controlplane.services.restarts import WorkerFailure, worker_failure_record

# SQLite answers "database is locked" when a writer holds the lock past the busy timeout: retry a few times.
RETRY = dict(autoretry_for=(OperationalError,), retry_backoff=1, retry_backoff_max=10, max_retries=3,
             ignore_result=True)


class AgentStartTask(Task):
    def on_failure(self, exc, task_id, args, kwargs, einfo):
        """A start that raised after its claim leaves a `starting` row without a process: report it like a
        process that could not start, so the restart policy retries it with backoff instead of leaving it stuck."""
        worker_id = args[0] if args else kwargs.get("worker_id")
        worker_failure_record(failure=WorkerFailure.not_started(
            worker_id=worker_id, detail=f"the node agent failed to start it: {exc!r}"))


@shared_task(name=AGENT_START_WORKER, bind=True, base=AgentStartTask, **RETRY)
def agent_start_worker(self, worker_id: int) -> str:
    return worker_start(worker_id=worker_id, node_name=runtime.node_name)


@shared_task(name=AGENT_STOP_WORKER, bind=True, **RETRY)
def agent_stop_worker(self, worker_id: int, deadline_s: float) -> str:
    return worker_stop(worker_id=worker_id, node_name=runtime.node_name, deadline_s=deadline_s)


@shared_task(name=AGENT_FAULT_INJECT, **RETRY)
def agent_fault_inject(key: str, kind: str, worker_id: int, until: float, audit: dict,
                       params: dict | None = None) -> str:
    """A chaos fault on one of this node's workers (controlplane.agent.faults): its outcome is an Action row.
    `params`: the fault's own settings (an error fault's ratio, a latency fault's ms)."""
    return fault_inject(key=key, kind=kind, worker_id=worker_id, until=until, audit=audit, params=params)


@shared_task(name=AGENT_FAULT_REVERT, **RETRY)
def agent_fault_revert(key: str, kind: str, worker_id: int, audit: dict) -> str:
    return fault_revert(key=key, kind=kind, worker_id=worker_id, audit=audit)


@shared_task(name=AGENT_MEASURE_HOST, **RETRY)
def agent_measure_host(node_name: str) -> str:
    """Measure this node's host again (controlplane.agent.host); a child process of a few seconds."""
    return host_measure(node_name=node_name)
