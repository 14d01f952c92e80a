"""`make run`'s supervisor restarts a child that died (with backoff) and stops all of them, each in its own
session so that a terminal's Ctrl-C reaches only the supervisor."""
from __future__ import annotations

import os
import sys
import time

import pytest

from controlplane.agent import processes
from controlplane.run.stack import ChildSpec, Stack
from tests.procs import ROOT

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_children_run_in_sessions_of_their_own(stack):
    s = stack([ChildSpec("a", SLEEPER), ChildSpec("b", SLEEPER)])
    s.start()
    for name in ("a", "b"):
        assert os.getsid(s.pid(name)) == s.pid(name) != os.getsid(0)


def test_a_child_that_dies_is_restarted_after_its_backoff(stack):
    s = stack([ChildSpec("flaky", [sys.executable, "-c", "import sys; sys.exit(1)"])])
    s.start()
    first = s.pid("flaky")
    deadline = time.monotonic() + 10
    restarted = []
    while not restarted:
        assert time.monotonic() < deadline
        restarted = s.poll()
        time.sleep(0.05)
    assert restarted == ["flaky"] and s.pid("flaky") != first
    child = s.children["flaky"]
    assert child.exits == [1] and child.num_restarts == 1 and child.backoff_s == 2.0


def test_stop_ends_every_child_and_nothing_restarts_afterwards(stack):
    s = stack([ChildSpec("a", SLEEPER), ChildSpec("b", SLEEPER)])
    s.start()
    handles = [s.children[name].handle for name in ("a", "b")]
    assert s.stop() == {"b": "terminated", "a": "terminated"}
    assert not any(processes.is_alive(h) for h in handles)
    assert s.poll() == []


def test_restart_replaces_one_child_and_keeps_the_others(stack):
    s = stack([ChildSpec("a", SLEEPER), ChildSpec("b", SLEEPER)])
    s.start()
    a, b = s.pid("a"), s.pid("b")
    s.restart("a")
    assert s.pid("a") != a and s.is_running("a") and s.pid("b") == b and s.is_running("b")


def test_child_names_must_be_unique(tmp_path):
    with pytest.raises(ValueError, match="unique"):
        Stack([ChildSpec("a", SLEEPER), ChildSpec("a", SLEEPER)], log_dir=tmp_path, env={}, cwd=tmp_path)


def test_children_get_sigterm_when_the_supervisor_is_killed(tmp_path):
    """A supervisor killed with SIGKILL (no chance to stop anything) still takes web, Celery and the agent along."""
    import signal
    import subprocess

    import psutil

    pid_file = tmp_path / "child.pid"
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from controlplane.run.stack import ChildSpec, Stack\n"
        f"s = Stack([ChildSpec('c', {SLEEPER!r})], log_dir=Path({str(tmp_path)!r}), env=dict(os.environ),"
        f" cwd=Path({str(tmp_path)!r}))\n"
        "s.start()\n"
        f"Path({str(pid_file)!r}).write_text(str(s.pid('c')))\n"
        "time.sleep(60)\n"
    )
    supervisor = subprocess.Popen([sys.executable, "-c", script], cwd=str(ROOT))
    try:
        deadline = time.monotonic() + 20
        while not (pid_file.exists() and pid_file.read_text()):
            assert time.monotonic() < deadline and supervisor.poll() is None
            time.sleep(0.05)
        child = psutil.Process(int(pid_file.read_text()))
        supervisor.send_signal(signal.SIGKILL)
        supervisor.wait(10)
        child.wait(timeout=10)  # raises TimeoutExpired if it outlived its supervisor
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
