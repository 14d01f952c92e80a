"""The heartbeat refreshes the node's last_seen_at, records a dead process at once (restart with backoff), stops a
process whose row says it should not run, and repairs locally: it starts a worker whose restart is due and reports
a starting one ready when its /health answers, with no broker message."""
from __future__ import annotations

import signal
import time
from datetime import timedelta

from django.utils import timezone

from controlplane.agent import launch, processes
from controlplane.agent.node import node_heartbeat
from controlplane.agent.workers import worker_start
from controlplane.models import Action, Node, Worker, WorkerStatus


def _started(deployment, node, cleanup):
    worker = Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role="decode"), role="decode",
                                   revision=deployment.current_revision, node=node, status=WorkerStatus.PENDING)
    worker_start(worker_id=worker.id, node_name=node.name)
    worker.refresh_from_db()
    cleanup.append(launch.handle_of(worker))
    return worker


def test_it_refreshes_the_node_last_seen_at(online_node):
    before = online_node.last_seen_at
    time.sleep(0.01)
    node_heartbeat(node=online_node)
    assert Node.objects.get(id=online_node.id).last_seen_at > before


def test_a_killed_worker_is_recorded_at_once_with_its_signal(deployment, online_node, fake_worker_argv,
                                                             cleanup_processes, sent):
    worker = _started(deployment, online_node, cleanup_processes)
    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.READY)
    processes.signal_group(launch.handle_of(worker), signal.SIGKILL)
    assert processes.wait_exit(launch.handle_of(worker), 30)

    assert node_heartbeat(node=online_node)["exited"] == [worker.id]
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.PENDING and worker.restart_count == 1
    assert Action.objects.get(kind="restart", worker=worker).reason.startswith("process killed by signal 9 (SIGKILL)")


def test_a_live_worker_is_left_alone(deployment, online_node, fake_worker_argv, cleanup_processes):
    worker = _started(deployment, online_node, cleanup_processes)
    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.READY)
    assert node_heartbeat(node=online_node) == {"exited": [], "stopped": [], "stale": [], "restarted": [],
                                                 "ready": []}
    assert processes.is_alive(launch.handle_of(worker))


def test_a_process_of_a_stopped_row_is_stopped(deployment, online_node, fake_worker_argv, cleanup_processes):
    worker = _started(deployment, online_node, cleanup_processes)
    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.STOPPED)
    assert node_heartbeat(node=online_node)["stale"] == [worker.id]
    assert processes.wait_exit(launch.handle_of(worker), 15)


def _wait(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = predicate()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_a_killed_worker_is_started_again_and_reported_ready_by_its_own_agent(deployment, online_node,
                                                                             fake_worker_argv, cleanup_processes,
                                                                             sent):
    worker = _started(deployment, online_node, cleanup_processes)
    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.READY)
    processes.signal_group(launch.handle_of(worker), signal.SIGKILL)
    assert processes.wait_exit(launch.handle_of(worker), 30)
    first = node_heartbeat(node=online_node)
    assert first["exited"] == [worker.id]
    # The backoff has passed and no start message came (the broker is away: `sent` swallows every message). On a
    # slow machine the backoff may already have passed within the first beat, which then restarted it itself.
    Worker.objects.filter(id=worker.id, status=WorkerStatus.PENDING).update(
        next_restart_at=timezone.now() - timedelta(seconds=1))
    assert first["restarted"] + node_heartbeat(node=online_node)["restarted"] == [worker.id]
    worker.refresh_from_db()
    cleanup_processes.append(launch.handle_of(worker))
    # Starting, or already ready when its /health answered within the same beat.
    assert worker.status in (WorkerStatus.STARTING, WorkerStatus.READY) and processes.is_alive(launch.handle_of(worker))
    _wait(lambda: Worker.objects.get(id=worker.id).status == WorkerStatus.READY
          or node_heartbeat(node=online_node)["ready"] == [worker.id])
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.READY
    restart = Action.objects.get(kind="restart", worker=worker)
    assert restart.status == "succeeded" and restart.actor_type == "system"
    assert not [m for m in sent if m[0] == "agent_start_worker"]


def test_a_restart_whose_backoff_has_not_passed_is_left_for_later(deployment, online_node, fake_worker_argv,
                                                                  cleanup_processes, sent, monkeypatch):
    # A 60 s backoff: a slow beat cannot outlast it and restart the worker itself (the 1 s default could).
    monkeypatch.setattr("controlplane.services.restarts.backoff_seconds", lambda num_recent_restarts: 60)
    worker = _started(deployment, online_node, cleanup_processes)
    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.READY)
    processes.signal_group(launch.handle_of(worker), signal.SIGKILL)
    assert processes.wait_exit(launch.handle_of(worker), 30)
    assert node_heartbeat(node=online_node)["restarted"] == []
    # Its backoff still runs: the next beats leave it pending.
    assert Worker.objects.get(id=worker.id).next_restart_at > timezone.now() + timedelta(seconds=30)
    assert node_heartbeat(node=online_node)["restarted"] == []
    assert Worker.objects.get(id=worker.id).status == WorkerStatus.PENDING
