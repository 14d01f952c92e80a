"""A worker row's log file is appended to by each of its processes, one after the other: the reason recorded for a
death quotes only lines that the process which died wrote, never its predecessor's error."""
from __future__ import annotations

import os
import signal
import sys

import pytest

from controlplane.agent import launch, processes
from controlplane.agent.node import node_heartbeat
from controlplane.agent.workers import worker_start
from controlplane.models import Action, Worker, WorkerStatus
from tests.controlplane.agent.logging_worker import use_logging_worker, wait_for_log, wait_until


@pytest.fixture
def stand_in(monkeypatch, settings, tmp_path):
    return use_logging_worker(monkeypatch, settings, tmp_path)


def _start(worker, node, cleanup) -> Worker:
    assert worker_start(worker_id=worker.id, node_name=node.name) == "started"
    worker.refresh_from_db()
    cleanup.append(launch.handle_of(worker))
    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.READY)
    return worker


def _death_reported(worker, node) -> None:
    wait_until(lambda: worker.id in node_heartbeat(node=node)["exited"], what="the death reported")


def test_the_second_process_of_a_worker_does_not_quote_the_error_of_the_first(deployment, online_node, stand_in,
                                                                              cleanup_processes, sent):
    worker = Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role="decode"), role="decode",
                                   revision=deployment.current_revision, node=online_node,
                                   status=WorkerStatus.PENDING)
    stand_in.next_steps("error:address already in use", "exit:1")
    _start(worker, online_node, cleanup_processes)
    _death_reported(worker, online_node)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.PENDING and "address already in use" in worker.last_error

    stand_in.next_steps("info:ready on port 41001")
    _start(worker, online_node, cleanup_processes)
    wait_for_log(worker.log_path, "ready on port")
    os.kill(worker.pid, signal.SIGKILL)
    _death_reported(worker, online_node)

    worker.refresh_from_db()
    second = Action.objects.filter(kind="restart", worker=worker).latest("id")
    assert worker.last_error == second.reason == "process killed by signal 9 (SIGKILL)"
    assert "address already in use" not in second.params["log_tail"]
    assert "ready on port" in second.params["log_tail"]


def test_the_log_tail_of_a_process_starts_where_its_own_output_began(tmp_path):
    log_path = tmp_path / "w.log"
    log_path.write_text("2026-11-30 10:00:00,000 decode[1] ERROR x: the previous process's error\n")
    handle = processes.spawn([sys.executable, "-c", "print('mine')"], log_path=log_path, marker=None)
    assert processes.wait_exit(handle, 30)
    assert processes.log_tail(log_path, handle=handle) == "mine"
