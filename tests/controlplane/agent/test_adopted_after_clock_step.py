"""A worker another agent started is recognised by its create time, which psutil derives from /proc/stat's btime:
whole seconds of the wall clock's idea of the boot, so a step of the clock (NTP, a VM's time sync) moves every
process's create time by a whole second at once. The same process, carrying its marker, must still be recognised
(taken for dead, it would be started a second time beside itself); a recycled pid must still not be."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from controlplane.agent import processes
from controlplane.agent.node import node_adopt, node_heartbeat
from controlplane.agent.processes import ProcessHandle
from controlplane.models import Action, WorkerStatus
from tests.controlplane.agent.logging_worker import use_logging_worker, wait_for_log
from tests.controlplane.agent.test_exit_reason_of_an_adopted_worker import _started_by_an_earlier_agent
from tests.procs import ROOT

EARLIER_AGENT = """
import json, sys
from pathlib import Path
from controlplane.agent import processes
handle = processes.spawn([sys.executable, "-c", "import time; time.sleep(120)"], log_path=Path(sys.argv[1]),
                         marker=sys.argv[2])
print(json.dumps({"pid": handle.pid, "create_time": handle.create_time}))
"""


@pytest.fixture
def adopted(tmp_path):
    """A sleeping worker spawned by another process (an earlier agent, gone): not this process's child."""
    import json

    done = subprocess.run([sys.executable, "-c", EARLIER_AGENT, str(tmp_path / "w.log"), "17"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=True)
    started = json.loads(done.stdout.strip().splitlines()[-1])
    handle = ProcessHandle(pid=started["pid"], create_time=started["create_time"], marker="17")
    yield handle
    try:
        os.killpg(handle.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture
def clock_stepped(monkeypatch):
    """The wall clock stepped since the worker was recorded: btime (psutil.boot_time) moved by `step` seconds."""
    platform_boot_time = psutil._psplatform.boot_time
    real = platform_boot_time()

    def step(seconds: float) -> None:
        monkeypatch.setattr(psutil._psplatform, "boot_time", lambda: real + seconds)

    return step


def test_the_same_process_is_recognised_after_a_clock_step_moved_btime_by_a_second(adopted, clock_stepped):
    assert processes.is_alive(adopted)
    for seconds in (1, -1, 2):
        clock_stepped(seconds)
        assert processes.is_alive(adopted), f"taken for dead after a {seconds:+} s step of btime"
    assert processes.signal_group(adopted, 0)  # and a stop would reach it


def test_after_a_clock_step_only_the_marker_proves_it_is_ours(adopted, clock_stepped):
    clock_stepped(1)
    assert not processes.is_alive(ProcessHandle(adopted.pid, adopted.create_time, marker="18"))
    assert not processes.is_alive(ProcessHandle(adopted.pid, adopted.create_time, marker=None))


def test_a_start_a_fraction_or_many_seconds_off_is_still_another_process(adopted, clock_stepped):
    for off_s in (0.5, -0.3, 1.5, 100.0, -100.0):
        assert not processes.is_alive(ProcessHandle(adopted.pid, adopted.create_time + off_s, marker="17")), off_s
    clock_stepped(1)
    assert not processes.is_alive(ProcessHandle(adopted.pid, adopted.create_time + 0.5, marker="17"))


@pytest.fixture
def stand_in(monkeypatch, settings, tmp_path):
    return use_logging_worker(monkeypatch, settings, tmp_path)


def test_a_heartbeat_after_a_clock_step_keeps_the_adopted_worker_instead_of_starting_it_again(
        deployment, online_node, stand_in, cleanup_processes, sent, clock_stepped):
    stand_in.next_steps("info:ready on port 41001")
    worker = _started_by_an_earlier_agent(deployment, online_node, stand_in, cleanup_processes)
    wait_for_log(worker.log_path, "ready on port")
    assert node_adopt(node=online_node)["adopted"] == [worker.id]

    clock_stepped(1)
    outcome = node_heartbeat(node=online_node)

    assert outcome["exited"] == [] and outcome["restarted"] == [] and outcome["stale"] == []
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.READY
    assert not Action.objects.filter(kind="restart", worker=worker).exists()
