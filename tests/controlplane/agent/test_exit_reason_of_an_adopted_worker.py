"""A worker started by an earlier agent is not this agent's child: when it dies, no exit status reaches this agent.
Its reason says so ("exit status unknown (started by an earlier agent)"), never "not our child", and quotes only
what that process wrote, though its log file also holds its predecessor's error."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone as dt_timezone

import pytest

from controlplane.agent import launch, processes
from controlplane.agent.node import node_adopt, node_heartbeat
from controlplane.models import Action, Worker, WorkerStatus
from tests.controlplane.agent.logging_worker import use_logging_worker, wait_for_log, wait_until
from tests.procs import ROOT

PREVIOUS_ERROR = "2026-11-30 09:00:00,000 decode[4100] ERROR inference.worker.server: the previous process's error\n"
EARLIER_AGENT = """
import json, sys
from pathlib import Path
from controlplane.agent import processes
log_path, marker, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
handle = processes.spawn(argv, log_path=Path(log_path), marker=marker)
print(json.dumps({"pid": handle.pid, "create_time": handle.create_time}))
"""


@pytest.fixture
def stand_in(monkeypatch, settings, tmp_path):
    return use_logging_worker(monkeypatch, settings, tmp_path)


def _started_by_an_earlier_agent(deployment, node, stand_in, cleanup) -> Worker:
    """A ready worker whose process another agent process (now gone) spawned, as the row would say after it."""
    worker = Worker.objects.create(deployment=deployment, pool=deployment.pools.get(role="decode"), role="decode",
                                   revision=deployment.current_revision, node=node, status=WorkerStatus.READY,
                                   port=processes.free_port())
    log_path = launch.log_path_for(worker)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text(PREVIOUS_ERROR)  # the row's previous process, before the earlier agent restarted it
    agent = subprocess.run([sys.executable, "-c", EARLIER_AGENT, str(log_path), str(worker.id),
                            *stand_in.argv(worker, worker.port)],
                           cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    spawned = json.loads(agent.stdout)
    Worker.objects.filter(id=worker.id).update(
        pid=spawned["pid"], log_path=str(log_path),
        started_at=datetime.fromtimestamp(spawned["create_time"], tz=dt_timezone.utc))
    worker.refresh_from_db()
    cleanup.append(launch.handle_of(worker))
    return worker


def test_an_adopted_worker_killed_later_says_its_exit_status_is_unknown_and_quotes_only_its_own_log(
        deployment, online_node, stand_in, cleanup_processes, sent):
    stand_in.next_steps("warning:KV pool is 97% full", "info:ready on port 41001")
    worker = _started_by_an_earlier_agent(deployment, online_node, stand_in, cleanup_processes)
    wait_for_log(worker.log_path, "ready on port")
    assert node_adopt(node=online_node)["adopted"] == [worker.id]

    os.kill(worker.pid, signal.SIGKILL)

    wait_until(lambda: worker.id in node_heartbeat(node=online_node)["exited"], what="the death reported")
    worker.refresh_from_db()
    reason = Action.objects.get(kind="restart", worker=worker).reason
    assert reason == worker.last_error
    assert reason.startswith("process ended; exit status unknown (started by an earlier agent); "
                             "last warning in its log: ")
    assert reason.endswith("WARNING inference.worker.server: KV pool is 97% full")
    assert "previous process" not in reason and "ready" not in reason and "not our child" not in reason


def test_a_worker_gone_before_the_agent_started_says_so_and_quotes_only_its_own_log(
        deployment, online_node, stand_in, cleanup_processes):
    stand_in.next_steps("info:ready on port 41001")
    worker = _started_by_an_earlier_agent(deployment, online_node, stand_in, cleanup_processes)
    wait_for_log(worker.log_path, "ready on port")
    os.kill(worker.pid, signal.SIGKILL)
    wait_until(lambda: not processes.is_alive(launch.handle_of(worker)), what="the process gone")

    assert node_adopt(node=online_node)["stopped"] == [worker.id]

    worker.refresh_from_db()
    assert worker.status == WorkerStatus.STOPPED
    assert worker.last_error == (f"process {worker.pid} was gone when node agent {online_node.name} started; "
                                 "exit status unknown (started by an earlier agent)")
