"""Worker processes are spawned in their own session, recognised by (pid, create time, marker), and stopped."""
from __future__ import annotations

import os
import sys
import time

import psutil
import pytest

from controlplane.agent import processes
from controlplane.agent.processes import ProcessHandle

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]
# Ignores SIGTERM, so only the SIGKILL after the deadline ends it.
STUBBORN = [sys.executable, "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ar' + 'med', flush=True); "
            "time.sleep(60)"]


@pytest.fixture
def spawned(tmp_path):
    handles = []

    def _spawn(argv, marker="7"):
        handle = processes.spawn(argv, log_path=tmp_path / "logs" / "w.log", marker=marker)
        handles.append(handle)
        return handle

    yield _spawn
    for handle in handles:
        processes.stop(handle, deadline_s=1)


def test_it_starts_the_child_in_its_own_session_with_the_marker(spawned):
    handle = spawned(SLEEPER, marker="42")
    proc = psutil.Process(handle.pid)
    assert os.getsid(handle.pid) == handle.pid != os.getsid(0)
    assert proc.environ()[processes.MARKER_ENV] == "42"
    assert processes.is_alive(handle)


def test_it_writes_the_child_output_to_the_log_file(spawned, tmp_path):
    handle = spawned([sys.executable, "-c", "print('hello from the worker')"])
    assert processes.wait_exit(handle, timeout=60)
    log = (tmp_path / "logs" / "w.log").read_text()
    assert "starting:" in log and "hello from the worker" in log
    assert "hello from the worker" in processes.log_tail(tmp_path / "logs" / "w.log")


def test_it_reaps_an_exited_child_instead_of_calling_the_zombie_alive(spawned):
    handle = spawned([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert processes.wait_exit(handle, timeout=60)
    assert not processes.is_alive(handle)
    with pytest.raises(ChildProcessError):  # already reaped: no zombie left behind
        os.waitpid(handle.pid, os.WNOHANG)
    assert processes.exit_code(handle.pid) == 3  # kept for the heartbeat's "process exited with code 3"
    assert processes.reap()[handle.pid] == 3
    assert processes.reap() == {}  # reaped once; its exit code stays known (test_exit_status_of_children)


def test_it_does_not_recognise_a_process_with_another_create_time(spawned):
    handle = spawned(SLEEPER)
    recycled = ProcessHandle(pid=handle.pid, create_time=handle.create_time - 100, marker=handle.marker)
    assert not processes.is_alive(recycled)
    assert processes.stop(recycled, deadline_s=1) == "gone"
    assert processes.is_alive(handle)  # the stop of a mistaken identity did not touch it


def test_it_does_not_recognise_a_process_without_the_marker(spawned):
    handle = spawned(SLEEPER, marker="1")
    assert not processes.is_alive(ProcessHandle(handle.pid, handle.create_time, marker="2"))


def test_it_stops_a_child_with_sigterm(spawned):
    handle = spawned(SLEEPER)
    started = time.monotonic()
    assert processes.stop(handle, deadline_s=10) == "terminated"
    assert time.monotonic() - started < 5
    assert not processes.is_alive(handle)


def test_it_kills_a_child_that_ignores_sigterm_after_the_deadline(spawned, tmp_path):
    handle = spawned(STUBBORN)
    deadline = time.monotonic() + 10
    while "\narmed" not in (tmp_path / "logs" / "w.log").read_text():  # SIGTERM must arrive after SIG_IGN is set
        assert time.monotonic() < deadline
        time.sleep(0.05)
    started = time.monotonic()
    assert processes.stop(handle, deadline_s=0.5) == "killed"
    assert 0.4 < time.monotonic() - started < 8
    assert not processes.is_alive(handle)


def test_stopping_also_ends_the_grandchildren_in_the_group(spawned, tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    parent = [sys.executable, "-c",
              "import subprocess, sys, time; "
              f"p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)"]
    handle = spawned(parent)
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = psutil.Process(int(pid_file.read_text()))
    processes.stop(handle, deadline_s=5)
    grandchild.wait(timeout=5)  # raises TimeoutExpired if it survived
    assert not grandchild.is_running()


def test_a_stopped_handle_is_gone_the_second_time(spawned):
    handle = spawned(SLEEPER)
    processes.stop(handle, deadline_s=5)
    assert processes.stop(handle, deadline_s=5) == "gone"


def test_free_port_is_bindable():
    import socket

    port = processes.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # raises OSError where the port is taken
        assert s.getsockname()[1] == port and 1024 <= port <= 65535


def test_free_port_never_hands_out_the_same_port_twice_in_a_row_of_starts(monkeypatch):
    # The kernel draws bind(0)'s port at random; 300 draws repeat one about 8 times in 10 (of ~28,000 ports).
    ports = [processes.free_port() for _ in range(300)]
    assert len(set(ports)) == 300
    # Past the quarantine they are forgotten (and may come back): only the newest is remembered.
    monkeypatch.setattr(processes, "PORT_QUARANTINE_S", -1.0)
    newest = processes.free_port()
    assert processes._handed_out.keys() == {newest}


def test_the_log_hides_the_gateway_token(spawned, tmp_path):
    handle = spawned([sys.executable, "-c", "pass", "--token", "s3cret-token"])
    processes.wait_exit(handle, timeout=60)
    log = (tmp_path / "logs" / "w.log").read_text()
    assert "s3cret-token" not in log and "--token ***" in log
