"""A worker whose children outlive it (vLLM's engine core and its worker processes, ~1.9 GB each, stay when the API
server exits on SIGTERM before them) leaves nothing behind: its stop, or the heartbeat that finds it dead, kills
the rest of its process group; a process of another group, or one without the worker's marker, is left alone."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from controlplane.agent import processes

# A leader that starts a child ignoring SIGTERM in its own process group, then exits on SIGTERM at once.
LEADER = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('child up', flush=True); "
    "time.sleep(600)"])
print("child", child.pid, flush=True)
time.sleep(600)
"""


def _child_pid(log, timeout=30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith("child ") and line.split()[1].isdigit():
                return int(line.split()[1])
        time.sleep(0.05)
    raise AssertionError(log.read_text())


def test_stopping_a_leader_kills_the_children_it_leaves_behind(tmp_path):
    log = tmp_path / "leader.log"
    handle = processes.spawn([sys.executable, "-c", LEADER], log_path=log, marker="leftovers-test")
    child = _child_pid(log)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        assert processes.stop(handle, deadline_s=10) == "terminated"  # the leader went at SIGTERM, its child not
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        assert stranger.poll() is None
    finally:
        stranger.kill()
        if psutil.pid_exists(child):
            psutil.Process(child).send_signal(signal.SIGKILL)
