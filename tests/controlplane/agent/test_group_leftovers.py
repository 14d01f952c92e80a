"""A worker whose children outlive it (vLLM's engine core and its worker processes, ~1.9 GB each, stay when the API
server exits on SIGTERM before them) leaves nothing behind: its stop, or the heartbeat that finds it dead, kills
the rest of its process group; a process of another group, or one with another worker's marker, is left alone."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import psutil

from controlplane.agent import processes

# A leader that starts two children ignoring SIGTERM in its process group, then exits on SIGTERM at once: one with
# no environment to speak of (as vLLM's processes show theirs once setproctitle renamed them), one that says it is
# another worker's.
LEADER = """
import subprocess, sys, time
IGNORE = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ignoring', flush=True); "
          "time.sleep(600)")
blank = subprocess.Popen([sys.executable, "-c", IGNORE], env={})
other = subprocess.Popen([sys.executable, "-c", IGNORE], env={"TANDEM_WORKER_ID": "someone-else"})
print("child", blank.pid, other.pid, flush=True)
time.sleep(600)
"""


def _child_pids(log, timeout=60.0) -> tuple[int, int]:
    """The two children's pids, once both ignore SIGTERM (a SIGTERM before that would end them: not the case here)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = log.read_text().splitlines()
        pids = [line for line in lines if line.startswith("child ")]
        if pids and sum(line == "ignoring" for line in lines) == 2:
            return int(pids[0].split()[1]), int(pids[0].split()[2])
        time.sleep(0.05)
    raise AssertionError(log.read_text())


def test_stopping_a_leader_kills_the_children_it_leaves_behind(tmp_path):
    log = tmp_path / "leader.log"
    handle = processes.spawn([sys.executable, "-c", LEADER], log_path=log, marker="leftovers-test")
    child, others = _child_pids(log)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        assert processes.stop(handle, deadline_s=10) == "terminated"  # the leader went at SIGTERM, its children not
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
        assert psutil.Process(others).status() != psutil.STATUS_ZOMBIE  # another worker's, by its marker
        assert stranger.poll() is None  # another group
    finally:
        stranger.kill()
        for pid in (child, others):
            if psutil.pid_exists(pid):
                psutil.Process(pid).send_signal(signal.SIGKILL)
