"""`make run`'s supervisor is the parent of web, Celery, beat and the agent: a child killed with SIGKILL is
recorded as such ("signal 9 (SIGKILL)") in its restart row, never "exit status unknown", also for a child with many
threads (web, the Celery worker, the agent), whose main thread is a zombie a moment before the process is gone."""
from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from controlplane.models import Action
from controlplane.run.audit import stack_restart_record
from controlplane.run.stack import ChildSpec
from tests.procs import MAIN_THREAD_GONE, SYS_EXIT



@pytest.mark.skipif(SYS_EXIT is None, reason="the exit syscall's number is known for x86_64 and aarch64 only")
def test_a_child_killed_with_sigkill_is_restarted_with_signal_9_in_its_restart_row(stack, db):
    s = stack([ChildSpec("web", MAIN_THREAD_GONE)])
    s.start()
    first = s.pid("web")
    deadline = time.monotonic() + 30
    while psutil.Process(first).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert s.poll() == [] and s.children["web"].exits == []  # still running: its other thread is

    os.kill(first, signal.SIGKILL)
    restarted = []
    while not restarted:
        assert time.monotonic() < deadline
        restarted = s.poll()
        time.sleep(0.05)

    child = s.children["web"]
    assert restarted == ["web"] and child.exits == [-signal.SIGKILL]
    action = stack_restart_record(process="web", exit_code=child.exits[-1], num_restarts=child.num_restarts,
                                  log_path=str(child.log_path))
    assert "web process exited (signal 9 (SIGKILL)) and was started again" in Action.objects.get(id=action.id).reason
