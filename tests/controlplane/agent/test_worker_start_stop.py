"""The agent starts a pending worker's process once (idempotent), records its identity, and stops it."""
from __future__ import annotations

import psutil
import pytest
import requests

from controlplane.agent import launch, processes
from controlplane.agent.workers import WrongNode, worker_start, worker_stop
from controlplane.models import Worker, WorkerStatus


def _pending(deployment, node):
    return Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role="decode"), role="decode",
                                 revision=deployment.current_revision, node=node, status=WorkerStatus.PENDING)


def _wait_health(worker):
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{worker.url}/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            time.sleep(0.1)
    raise AssertionError("the fake worker never answered")


def test_it_starts_a_pending_worker_and_records_pid_port_and_process_identity(
        deployment, online_node, fake_worker_argv, cleanup_processes):
    worker = _pending(deployment, online_node)
    assert worker_start(worker_id=worker.id, node_name="local") == "started"
    worker.refresh_from_db()
    handle = launch.handle_of(worker)
    cleanup_processes.append(handle)
    assert worker.status == WorkerStatus.STARTING and worker.port and worker.pid == handle.pid
    proc = psutil.Process(worker.pid)
    assert proc.environ()[processes.MARKER_ENV] == str(worker.id)
    assert abs(proc.create_time() - worker.started_at.timestamp()) < 0.01
    assert worker.log_path.endswith(f"demo-decode-{worker.id}.log")
    _wait_health(worker)


def test_a_second_start_of_the_same_worker_does_nothing(deployment, online_node, fake_worker_argv,
                                                         cleanup_processes):
    worker = _pending(deployment, online_node)
    worker_start(worker_id=worker.id, node_name="local")
    worker.refresh_from_db()
    cleanup_processes.append(launch.handle_of(worker))
    assert worker_start(worker_id=worker.id, node_name="local") == "not-pending"
    assert Worker.objects.get(id=worker.id).pid == worker.pid


def test_restarting_stops_the_previous_process_of_the_row_first(deployment, online_node, fake_worker_argv,
                                                                cleanup_processes):
    worker = _pending(deployment, online_node)
    worker_start(worker_id=worker.id, node_name="local")
    worker.refresh_from_db()
    first = launch.handle_of(worker)
    cleanup_processes.append(first)
    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.PENDING)  # the restart policy's doing

    assert worker_start(worker_id=worker.id, node_name="local") == "started"
    worker.refresh_from_db()
    cleanup_processes.append(launch.handle_of(worker))
    assert not processes.is_alive(first) and worker.pid != first.pid


def test_it_refuses_a_worker_of_another_node(deployment, online_node, fake_worker_argv):
    worker = _pending(deployment, online_node)
    with pytest.raises(WrongNode):
        worker_start(worker_id=worker.id, node_name="elsewhere")
    assert Worker.objects.get(id=worker.id).status == WorkerStatus.PENDING


def test_stop_terminates_the_process_and_marks_the_worker_stopped(deployment, online_node, fake_worker_argv,
                                                                  cleanup_processes, settings):
    settings.TANDEM_DRAIN_GRACE_S = 0
    worker = _pending(deployment, online_node)
    worker_start(worker_id=worker.id, node_name="local")
    worker.refresh_from_db()
    handle = launch.handle_of(worker)
    cleanup_processes.append(handle)
    _wait_health(worker)
    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.DRAINING)

    assert worker_stop(worker_id=worker.id, node_name="local", deadline_s=5) == "stopped"
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED and worker.stopped_at is not None
    assert not processes.is_alive(handle)


def test_a_new_process_takes_its_kv_pushes_on_its_own_port(deployment, online_node, fake_worker_argv,
                                                           cleanup_processes):
    """A chaos KV fault's proxy was in front of the previous process (Worker.kv_port), not in front of this one."""
    worker = _pending(deployment, online_node)
    Worker.objects.filter(pk=worker.pk).update(kv_port=40999)
    assert worker_start(worker_id=worker.id, node_name="local") == "started"
    worker.refresh_from_db()
    cleanup_processes.append(launch.handle_of(worker))
    assert worker.kv_port is None and worker.port
