"""A process the agent started is its child: the agent reaps it and knows how it ended, exit code or signal, as
soon as it no longer calls it alive, also while its other threads are still dying after a SIGKILL (its main thread
already a zombie) and after a heartbeat reaped it."""
from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from controlplane.agent import processes
from tests.procs import MAIN_THREAD_GONE, SYS_EXIT

# Busy threads, as a worker running torch has: after a SIGKILL the main thread is a zombie a moment before the
# others are gone, and only then can the process be reaped.
MANY_THREADS = [sys.executable, "-c",
                "import threading, time\n"
                "def spin():\n"
                "    while True: pass\n"
                "for _ in range(4): threading.Thread(target=spin, daemon=True).start()\n"
                "print('threads up', flush=True); time.sleep(600)"]


@pytest.fixture
def spawned(tmp_path):
    handles = []

    def spawn(argv, ready_line):
        log_path = tmp_path / "logs" / f"w{len(handles)}.log"
        handle = processes.spawn(argv, log_path=log_path, marker="7")
        handles.append(handle)
        deadline = time.monotonic() + 30
        while ready_line not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.02)
        return handle

    yield spawn
    for handle in handles:
        processes.stop(handle, deadline_s=1)


def test_a_child_killed_with_sigkill_is_known_to_have_died_of_signal_9_once_it_is_not_alive(spawned):
    # The zombie main thread shows for a few milliseconds only: an agent that took it for the end lost the exit
    # status in about 1 kill of 3 here. The test after this one pins the same rule down without luck.
    for _ in range(5):
        handle = spawned(MANY_THREADS, "threads up")
        time.sleep(0.2)  # the threads at work, as a serving worker's are
        os.kill(handle.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while processes.is_alive(handle):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        assert processes.exit_code(handle.pid) == -signal.SIGKILL


@pytest.mark.skipif(SYS_EXIT is None, reason="the exit syscall's number is known for x86_64 and aarch64 only")
def test_a_child_whose_main_thread_is_a_zombie_is_alive_until_it_can_be_reaped(spawned):
    handle = spawned(MAIN_THREAD_GONE, "leaving the main thread")
    deadline = time.monotonic() + 10
    while psutil.Process(handle.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.01)

    assert processes.is_alive(handle) and processes.exit_code(handle.pid) is None

    assert processes.signal_group(handle, signal.SIGKILL)
    assert processes.wait_exit(handle, 30)
    assert processes.exit_code(handle.pid) == -signal.SIGKILL


def test_the_exit_status_is_still_known_after_a_heartbeat_reaped_the_child(spawned):
    handle = spawned([sys.executable, "-c", "import sys; print('bye', flush=True); sys.exit(3)"], "bye")
    assert processes.wait_exit(handle, 30)
    processes.reap()  # a heartbeat whose report then failed (the database was locked) must not lose it
    assert processes.exit_code(handle.pid) == 3
    assert processes.exit_code(handle.pid, create_time=handle.create_time + 100) is None  # another process's pid
