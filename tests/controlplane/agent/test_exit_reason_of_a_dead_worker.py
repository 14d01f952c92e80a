"""The reason the node agent records for a worker whose process died says how it ended ("killed by signal 9
(SIGKILL)", "exited with code 1") and the last warning or error line of its log, never an INFO line: it is the
worker's last_error and the reason of its restart action."""
from __future__ import annotations

import os
import signal

import pytest

from controlplane.agent import launch
from controlplane.agent.node import node_heartbeat
from controlplane.agent.workers import worker_start
from controlplane.models import Action, Worker, WorkerStatus
from tests.controlplane.agent.logging_worker import use_logging_worker, wait_for_log, wait_until

TOKENIZER_WARNING = "Token indices sequence length is longer than the specified maximum sequence length (2100 > 2048)"


@pytest.fixture
def stand_in(monkeypatch, settings, tmp_path):
    return use_logging_worker(monkeypatch, settings, tmp_path)


def _started(deployment, node, cleanup) -> Worker:
    worker = Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role="decode"), role="decode",
                                   revision=deployment.current_revision, node=node, status=WorkerStatus.PENDING)
    assert worker_start(worker_id=worker.id, node_name=node.name) == "started"
    worker.refresh_from_db()
    cleanup.append(launch.handle_of(worker))
    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.READY)
    return worker


def _reported(worker, node) -> tuple[str, str]:
    """The heartbeats until one reports the worker's death: (its last_error, its restart action's reason)."""
    wait_until(lambda: worker.id in node_heartbeat(node=node)["exited"], what="the death reported")
    worker.refresh_from_db()
    return worker.last_error, Action.objects.get(kind="restart", worker=worker).reason


def test_a_worker_killed_with_sigkill_is_reported_killed_by_signal_9_with_its_last_warning(
        deployment, online_node, stand_in, cleanup_processes, sent):
    stand_in.next_steps(f"warning:{TOKENIZER_WARNING}", "info:ready on port 41001")
    worker = _started(deployment, online_node, cleanup_processes)
    wait_for_log(worker.log_path, "ready on port")

    os.kill(worker.pid, signal.SIGKILL)  # what `kill -9 <pid>` does

    last_error, reason = _reported(worker, online_node)
    assert reason == last_error
    assert reason.startswith("process killed by signal 9 (SIGKILL); last warning in its log: ")
    assert reason.endswith(f"WARNING inference.worker.server: {TOKENIZER_WARNING}")
    assert "ready" not in reason and "not our child" not in reason


def test_a_killed_worker_whose_log_has_only_info_lines_quotes_nothing(deployment, online_node, stand_in,
                                                                       cleanup_processes, sent):
    stand_in.next_steps("info:loading weights", "print:Loading weights: 100%", "info:ready on port 41001")
    worker = _started(deployment, online_node, cleanup_processes)
    wait_for_log(worker.log_path, "ready on port")

    os.kill(worker.pid, signal.SIGKILL)

    last_error, reason = _reported(worker, online_node)
    assert reason == last_error == "process killed by signal 9 (SIGKILL)"


def test_a_worker_that_raised_is_reported_with_its_exit_code_and_the_last_line_of_its_traceback(
        deployment, online_node, stand_in, cleanup_processes, sent):
    stand_in.next_steps("warning:slow disk", "info:loading weights", "raise:weights file is truncated")
    worker = _started(deployment, online_node, cleanup_processes)

    last_error, reason = _reported(worker, online_node)
    assert reason == last_error == ("process exited with code 1; last error in its log: "
                                    "RuntimeError: weights file is truncated")
    restart = Action.objects.get(kind="restart", worker=worker)
    assert restart.params["log_tail"].splitlines()[-1] == "RuntimeError: weights file is truncated"


def test_a_worker_that_exited_on_its_own_after_an_error_line_quotes_that_line(deployment, online_node, stand_in,
                                                                              cleanup_processes, sent):
    stand_in.next_steps("error:CUDA out of memory", "info:shutting down", "exit:3")
    worker = _started(deployment, online_node, cleanup_processes)

    _, reason = _reported(worker, online_node)
    assert reason.startswith("process exited with code 3; last error in its log: ")
    assert reason.endswith("ERROR inference.worker.server: CUDA out of memory")
