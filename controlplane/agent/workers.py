"""The node agent's two jobs for one Worker row: start its process, stop its process.

Both are idempotent and claim their transition with a conditional UPDATE, so a message delivered twice (or a
second reconciler) does the work once: only a `pending` row is started, and a row whose process is alive is
never started again.
"""
from __future__ import annotations

import logging
import time
from datetime import datetime, timezone as dt_timezone

from django.conf import settings
from django.utils import timezone

from controlplane.agent import fault_holds, launch, runtime
from controlplane.models import Worker, WorkerPurpose, WorkerStatus
from controlplane.services.restarts import WorkerFailure, worker_failure_record

log = logging.getLogger(__name__)


class WrongNode(Exception):
    """A task for another node's worker reached this agent: a routing bug, never acted on."""


def _check_node(worker: Worker, node_name: str | None) -> None:
    if node_name is not None and (worker.node is None or worker.node.name != node_name):
        raise WrongNode(f"worker {worker.id} belongs to node {worker.node and worker.node.name!r}, "
                        f"not to this agent ({node_name!r})")


def worker_start(*, worker_id: int, node_name: str | None) -> str:
    """Start the process of a pending worker. Returns what happened: "started", "not-pending", "gone".

    1. Only a pending row is started; any other status means it already runs (or should not).
    2. A stale process of the row's previous life (a restart after failed health checks) is stopped first.
    3. Claim pending → starting (conditional on the pid we saw), spawn, record pid, port and the process's create
       time (started_at), which is the identity later checks compare.
    """
    worker = (Worker.objects.select_related("deployment", "shared_gateway", "revision", "node")
              .filter(id=worker_id).first())
    if worker is None:
        return "gone"
    _check_node(worker, node_name)
    if worker.status != WorkerStatus.PENDING:
        return "not-pending"
    stale = launch.handle_of(worker)
    if stale is not None and runtime.launcher.is_alive(stale):
        fault_holds.pause_superseded(worker_id=worker.id, by="its restart")  # one or the other: no resume after this
        outcome = runtime.launcher.stop(stale, deadline_s=settings.TANDEM_STOP_DEADLINE_S)
        log.info("worker %s: stopped its previous process %d (%s) before restarting", worker.id, stale.pid, outcome)
    num_claimed = Worker.objects.filter(id=worker.id, status=WorkerStatus.PENDING, pid=worker.pid).update(
        status=WorkerStatus.STARTING, pid=None, started_at=None, ready_at=None, consecutive_health_failures=0,
        dtype="", quantization="", weight_bytes=None,  # the new process reports its own
    )
    if num_claimed != 1:
        return "not-pending"  # another agent thread (a duplicate message) got there first

    port = launch.gateway_port(worker) if worker.role == "gateway" else runtime.launcher.free_port(worker.host)
    log_path = launch.log_path_for(worker)
    # A shared gateway's: whose worker keys its process gets, recorded with its pid (reconcile restarts it for a
    # deployment attached later).
    keys = launch.shared_gateway_keys(worker) if worker.shared_gateway_id is not None else None
    try:
        gpu_index = launch.gpu_pick(worker)
        argv = launch.argv_for(worker, port)
        handle = runtime.launcher.spawn(argv, log_path=log_path, marker=str(worker.id),
                                 env=launch.env_for(worker, gpu_index, worker_keys=keys), cwd=settings.BASE_DIR)
    except Exception as exc:
        # Nothing runs: reported like a process that exited, so the restart policy (and its limit) applies.
        Worker.objects.filter(id=worker.id, status=WorkerStatus.STARTING).update(
            port=port, log_path=str(log_path), started_at=timezone.now())
        worker_failure_record(failure=WorkerFailure.not_started(worker_id=worker.id,
                                                                detail=f"could not start the process: {exc}"))
        return "spawn-failed"

    started_at = datetime.fromtimestamp(handle.create_time, tz=dt_timezone.utc)
    # kv_port: a KV fault's proxy was in front of the previous process, not this one (proxy_faults).
    num_updated = Worker.objects.filter(id=worker.id, status=WorkerStatus.STARTING, pid__isnull=True).update(
        pid=handle.pid, port=port, log_path=str(log_path), started_at=started_at, last_error="",
        gpu_index=gpu_index, kv_port=None, worker_keys_of=sorted(keys or ()),
    )
    if num_updated != 1:
        # The row was drained or deleted while we spawned: this process must not outlive it.
        log.info("worker %s changed while starting; stopping the new process %d", worker.id, handle.pid)
        runtime.launcher.stop(handle, deadline_s=settings.TANDEM_STOP_DEADLINE_S)
        Worker.objects.filter(id=worker.id, status=WorkerStatus.DRAINING).update(
            status=WorkerStatus.STOPPED, stopped_at=timezone.now())
        return "cancelled"
    log.info("worker %s (%s) started: pid %d port %d", worker.id, worker.role, handle.pid, port)
    return "started"


def worker_stop(*, worker_id: int, node_name: str | None, deadline_s: float) -> str:
    """Stop a worker's process: out of membership (draining), a grace period for the gateway to notice, SIGTERM
    (the worker finishes its in-flight requests), SIGKILL after deadline_s. Returns "stopped" or "gone".
    """
    worker = Worker.objects.select_related("deployment", "shared_gateway", "node").filter(id=worker_id).first()
    if worker is None:
        return "gone"
    _check_node(worker, node_name)
    was_serving = worker.status == WorkerStatus.READY
    if worker.status in (WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.READY):
        Worker.objects.filter(id=worker.id, status=worker.status).update(status=WorkerStatus.DRAINING)
        worker.refresh_from_db()
    if worker.status != WorkerStatus.DRAINING:
        return "not-draining"  # already stopped or failed: nothing runs
    handle = launch.handle_of(worker)
    outcome = "gone"
    if handle is not None and runtime.launcher.is_alive(handle):
        if worker.purpose == WorkerPurpose.SERVING and (was_serving or worker.ready_at is not None):
            # The gateway polls membership every 2 s; new requests must have stopped arriving before SIGTERM
            # makes this worker answer 503. (A profile run's worker was never in the membership.)
            time.sleep(settings.TANDEM_DRAIN_GRACE_S)
        fault_holds.pause_superseded(worker_id=worker.id, by="its stop")
        outcome = runtime.launcher.stop(handle, deadline_s=deadline_s)
    Worker.objects.filter(id=worker.id, status=WorkerStatus.DRAINING).update(
        status=WorkerStatus.STOPPED, stopped_at=timezone.now(), next_restart_at=None,
        last_error=worker.last_error if outcome != "killed" else f"killed after {deadline_s:g} s without exiting",
    )
    log.info("worker %s (%s) stopped: %s", worker.id, worker.role, outcome)
    return "stopped"
