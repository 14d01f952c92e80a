"""Stopping the inference processes of this node when `make run` ends.

Chosen over asking the agent: by then the agent (and the control worker and beat) are stopped first, so nothing
restarts what is being stopped, and the supervisor runs on the same host and can signal the recorded processes
itself (identity checked by pid, create time and marker, as the agent does).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.utils import timezone

from controlplane.agent import launch, processes
from controlplane.models import Worker, WorkerStatus


def node_processes_stop(*, node_name: str, reason: str) -> dict[int, str]:
    """Stop every process of this node's workers (gateways too), in parallel; mark the rows stopped. Returns
    {worker id: outcome}."""
    rows = list(Worker.objects.filter(node__name=node_name, pid__isnull=False).exclude(
        status__in=(WorkerStatus.STOPPED, WorkerStatus.FAILED)))
    handles = {worker.id: launch.handle_of(worker) for worker in rows}

    def stop(worker_id: int) -> str:
        handle = handles[worker_id]
        return "gone" if handle is None else processes.stop(handle, deadline_s=settings.TANDEM_STOP_DEADLINE_S)

    with ThreadPoolExecutor(max_workers=max(1, len(rows))) as pool:
        outcomes = dict(zip(handles, pool.map(stop, handles)))
    Worker.objects.filter(id__in=list(outcomes)).exclude(status__in=(WorkerStatus.STOPPED, WorkerStatus.FAILED)).update(
        status=WorkerStatus.STOPPED, stopped_at=timezone.now(), next_restart_at=None, last_error=reason)
    # Pending rows without a process would be started by the next run's agent: they stay as desired state.
    return outcomes
