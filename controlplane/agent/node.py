"""The node agent's life: register its Node, re-adopt the processes that outlived its last run, and a heartbeat.

The heartbeat (every TANDEM_HEARTBEAT_INTERVAL_S) refreshes Node.last_seen_at, which placement reads, and checks
every process this node should be running. A dead one is reported at once (controlplane.services.restarts decides:
restart with backoff, or give up), so the control plane does not wait for N failed health checks; a process whose
row says it should not run (stopped, failed, pending for a restart) is stopped. The rows are the truth; the
heartbeat makes the host agree with them.

Local repair, as a kubelet restarts containers: once a restart's backoff has passed, the heartbeat starts the
worker itself instead of waiting for the start message, and reports it ready when its /health answers. Both need
only the database, so a worker that dies while the broker (or the control worker) is away is back within seconds;
reconcile's own start message, when it comes, finds the row already claimed.
"""
from __future__ import annotations

import logging
import os
import socket
import threading

import psutil
import requests
from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from controlplane.agent import launch, processes, runtime
from controlplane.agent.gpus import discover_gpus
from controlplane.agent.workers import worker_start
from controlplane.models import Node, Worker, WorkerStatus
from controlplane.models.workers import health_answer_dtype, health_answer_ok, health_answer_weights
from controlplane.services.restarts import (WorkerFailure, exit_reason, worker_failure_record,
                                            worker_ready_record)

log = logging.getLogger(__name__)

# A local /health probe: the worker is on this host, so a slow answer means it is still loading.
PROBE_TIMEOUT_S = 1.0
# Pids being stopped by a background thread right now, so that a slow stop is not started twice.
_stopping: set[int] = set()
_stopping_lock = threading.Lock()


def detected_labels(gpus: list[dict]) -> dict[str, str]:
    """What this host is, as labels pools can select on."""
    labels = {"cpu.count": str(os.cpu_count() or 1),
              "memory_gib": str(round(psutil.virtual_memory().total / 2**30))}
    if gpus:
        labels.update({"gpu.model": gpus[0].get("name", ""), "gpu.count": str(len(gpus)),
                       "gpu.memory_gib": str(round(gpus[0].get("memory_total_bytes", 0) / 2**30))})
    else:
        labels["gpu.count"] = "0"
    return labels


def node_register(*, name: str, address: str = "127.0.0.1", labels: dict[str, str] | None = None) -> Node:
    """Register (or refresh) this node: address, GPUs, detected labels; `labels` (the agent's --label) are merged
    into the ones operators set, winning for their keys."""
    node, _ = Node.objects.get_or_create(name=name, defaults={"queue": Node.queue_for(name)})
    node.hostname = socket.gethostname()
    node.address = address
    node.gpus = discover_gpus()
    node.detected_labels = detected_labels(node.gpus)
    node.labels = {**(node.labels or {}), **(labels or {})}
    node.last_seen_at = timezone.now()
    node.save(update_fields=["hostname", "address", "gpus", "detected_labels", "labels", "last_seen_at"])
    log.info("node %s registered (%s, %d GPU(s), labels %s)", name, node.hostname, len(node.gpus), node.all_labels)
    return node


def node_adopt(*, node: Node) -> dict[str, list[int]]:
    """After an agent (re)start: keep the workers whose processes are still alive, mark the others stopped.

    A row in starting without a pid was claimed by the previous agent but never spawned: back to pending.
    A draining row whose process lives was being stopped when the agent went down: the stop is resumed.
    Returns the worker ids per outcome (for the log and tests).
    """
    outcome: dict[str, list[int]] = {"adopted": [], "stopped": [], "requeued": [], "draining": []}
    now = timezone.now()
    rows = Worker.objects.filter(node=node, status__in=(WorkerStatus.STARTING, WorkerStatus.READY,
                                                        WorkerStatus.DRAINING))
    for worker in rows.select_related("deployment"):
        handle = launch.handle_of(worker)
        if handle is None:
            if Worker.objects.filter(id=worker.id, status=WorkerStatus.STARTING, pid__isnull=True).update(
                    status=WorkerStatus.PENDING, next_restart_at=None):
                outcome["requeued"].append(worker.id)
            elif worker.status == WorkerStatus.DRAINING:
                Worker.objects.filter(id=worker.id, status=WorkerStatus.DRAINING).update(
                    status=WorkerStatus.STOPPED, stopped_at=now)
                outcome["stopped"].append(worker.id)
            continue
        if runtime.launcher.is_alive(handle):
            if worker.status == WorkerStatus.DRAINING:
                _stop_in_background(worker.id, handle, then_status=WorkerStatus.STOPPED)
                outcome["draining"].append(worker.id)
            else:
                outcome["adopted"].append(worker.id)
            continue
        # It ended while no agent ran (killed, or the host restarted): an earlier agent was its parent.
        tail = runtime.launcher.log_tail(worker.log_path, 40, handle=handle)
        num = Worker.objects.filter(id=worker.id, status=worker.status, pid=worker.pid).update(
            status=WorkerStatus.STOPPED, stopped_at=now,
            last_error=exit_reason(exit_code=None, log_tail=tail,
                                   ended=f"process {worker.pid} was gone when node agent {node.name} started"),
        )
        if num:
            outcome["stopped"].append(worker.id)
    log.info("node %s re-adoption: %s", node.name, outcome)
    return outcome


def node_heartbeat(*, node: Node) -> dict[str, list[int]]:
    """One heartbeat: last_seen_at, every process of this node checked against its row, then local repair."""
    outcome: dict[str, list[int]] = {"exited": [], "stopped": [], "stale": [], "restarted": [], "ready": []}
    Node.objects.filter(id=node.id).update(last_seen_at=timezone.now())
    # Reap our children that ended (no zombies pile up); their exit codes stay known to exit_code.
    runtime.launcher.reap()
    rows = Worker.objects.filter(node=node, pid__isnull=False).exclude(started_at__isnull=True)
    for worker in rows.only("id", "pid", "status", "started_at", "log_path", "role"):
        handle = launch.handle_of(worker)
        alive = runtime.launcher.is_alive(handle)
        if alive:
            processes.log_rotate(worker.log_path, settings.TANDEM_LOG_MAX_BYTES)
        if worker.status in (WorkerStatus.STARTING, WorkerStatus.READY) and not alive:
            # A process this agent started is its child, whose exit status is known once it is not alive; None:
            # an earlier agent started it.
            failure = WorkerFailure.exited(
                worker_id=worker.id, pid=worker.pid,
                exit_code=runtime.launcher.exit_code(worker.pid, create_time=handle.create_time),
                log_tail=runtime.launcher.log_tail(worker.log_path, 40, handle=handle))
            if worker_failure_record(failure=failure):
                outcome["exited"].append(worker.id)
            # Its children (vLLM's engine core) outlive a leader that died: they go with it.
            runtime.launcher.group_leftovers_kill(handle)
        elif worker.status == WorkerStatus.DRAINING and not alive:
            if Worker.objects.filter(id=worker.id, status=WorkerStatus.DRAINING).update(
                    status=WorkerStatus.STOPPED, stopped_at=timezone.now()):
                outcome["stopped"].append(worker.id)
            runtime.launcher.group_leftovers_kill(handle)
        elif worker.status in (WorkerStatus.PENDING, WorkerStatus.STOPPED, WorkerStatus.FAILED):
            if alive:
                # A process its row disowns: a hung worker awaiting restart, or one left over from a lost stop.
                _stop_in_background(worker.id, handle, then_status=None)
                outcome["stale"].append(worker.id)
            elif worker.status != WorkerStatus.PENDING:
                # Confirmed dead: forget the pid, so later heartbeats skip this history row.
                Worker.objects.filter(id=worker.id, status=worker.status, pid=worker.pid).update(pid=None)
    _repair(node, outcome)
    return outcome


def _repair(node: Node, outcome: dict[str, list[int]]) -> None:
    """Start this node's workers whose restart is due, and report the starting ones that answer /health."""
    now = timezone.now()
    due = Worker.objects.filter(node=node, status=WorkerStatus.PENDING, next_restart_at__isnull=False,
                                next_restart_at__lte=now).values_list("id", flat=True)
    for worker_id in due:
        if worker_start(worker_id=worker_id, node_name=node.name) == "started":
            outcome["restarted"].append(worker_id)
    starting = Worker.objects.filter(node=node, status=WorkerStatus.STARTING, pid__isnull=False,
                                     port__isnull=False).only("id", "pid", "role", "host", "port")
    for worker in starting:
        try:
            answer = requests.get(f"{worker.url}/health", timeout=PROBE_TIMEOUT_S)
        except requests.RequestException:
            continue  # still loading: the health checker's startup timeout judges a start that never answers
        if health_answer_ok(worker.role, answer.status_code) and worker_ready_record(
                worker_id=worker.id, pid=worker.pid, dtype=health_answer_dtype(answer),
                weights=health_answer_weights(answer)):
            outcome["ready"].append(worker.id)


def _stop_in_background(worker_id: int, handle: processes.ProcessHandle, *, then_status) -> None:
    with _stopping_lock:
        if handle.pid in _stopping:
            return
        _stopping.add(handle.pid)

    def run():
        try:
            runtime.launcher.stop(handle, deadline_s=settings.TANDEM_STOP_DEADLINE_S)
            if then_status is not None:
                Worker.objects.filter(id=worker_id, status=WorkerStatus.DRAINING).update(
                    status=then_status, stopped_at=timezone.now())
        except Exception:
            log.exception("stopping worker %s (pid %d) failed", worker_id, handle.pid)
        finally:
            with _stopping_lock:
                _stopping.discard(handle.pid)
            close_old_connections()

    threading.Thread(target=run, name=f"stop-{worker_id}", daemon=True).start()


class Heartbeat(threading.Thread):
    """node_heartbeat every interval until stopped; an error is logged and the next beat tries again."""

    def __init__(self, node: Node, interval_s: float):
        super().__init__(name=f"heartbeat-{node.name}", daemon=True)
        self.node, self.interval_s = node, interval_s
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self.interval_s):
            try:
                close_old_connections()
                node_heartbeat(node=self.node)
            except Exception:
                log.exception("heartbeat of node %s failed", self.node.name)

    def stop(self) -> None:
        self._stop_event.set()
