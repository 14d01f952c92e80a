"""The node agent's db_slow, on stand-ins of this test's own (never the session's shared PostgreSQL, never the test
database): a process that listens on a free port with a child, as a postmaster with a backend, is stopped and
continued in a cycle, both of them, about the asked share of each cycle (sampled states: the child's CPU loop
speed, measured here before, follows how much CPU a loaded host leaves it, and a process continued after a stop
catches up on its share); nothing is left stopped after the deadline, a revert, an agent's restart or its exit. On SQLite, a writer's BEGIN waits while the
agent holds the write lock, and nothing holds it afterwards."""
from __future__ import annotations

import random
import signal
import sqlite3
import sys
import time

import psutil
import pytest

from controlplane.agent import control_faults, fault_holds, fault_resume, faults, processes, runtime
from controlplane.models import Action
from tests.controlplane.chaos.conftest import process_state, wait_until
from tests.procs import free_port

AUDIT = {"chaos_run": 1, "experiment": "t"}
# The child counts as fast as it can and writes its count into a file every so often.
CHILD = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
count = 0
while True:
    count += 1
    if count % 5000 == 0:
        os.pwrite(fd, count.to_bytes(8, "little"), 0)
"""
POSTMASTER = """
import socket, subprocess, sys
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen()
subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[3]]).wait()
"""


@pytest.fixture
def agent_of(world, monkeypatch):
    """This process as the node agent of the decode worker's node."""
    monkeypatch.setattr(runtime, "node_name", world["decode"].node.name)
    return world["decode"]


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """A 'postmaster' of this test's own on a free port, with one busy 'backend'; the agent's database is it."""
    port, counter = free_port(), tmp_path / "count"
    handle = processes.spawn([sys.executable, "-c", POSTMASTER, str(port), CHILD, str(counter)],
                             log_path=tmp_path / "stand-in.log", marker=None)
    parent = psutil.Process(handle.pid)
    child = wait_until("the backend to start", lambda: (parent.children() or [None])[0], timeout=30)
    wait_until("the port to listen", lambda: control_faults._listener(port), timeout=30)
    wait_until("the backend to count", lambda: counter.exists() and counter.stat().st_size == 8, timeout=30)
    monkeypatch.setattr(control_faults, "database_here",
                        lambda: {"database": "postgresql", "host": "127.0.0.1", "port": port})
    yield parent, child, lambda: int.from_bytes(counter.read_bytes(), "little")
    for sig in (signal.SIGCONT, signal.SIGKILL):
        processes.signal_group(handle, sig)
    processes.wait_exit(handle, 10)


def _stopped_share(pid: int, seconds: float) -> float:
    """The share of the process's states, sampled for `seconds`, that found it stopped."""
    num = num_stopped = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        num += 1
        num_stopped += process_state(pid) == "stopped"
        time.sleep(0.003)
    return num_stopped / num


def _states(*pids: int, seconds: float) -> list[set[str]]:
    """Each process's states, sampled for `seconds`."""
    seen = [set() for _ in pids]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for states, pid in zip(seen, pids):
            states.add(process_state(pid))
        time.sleep(0.003)
    return seen


def _running(*pids: int) -> bool:
    return all(process_state(pid) in ("running", "sleeping") for pid in pids)


def _inject(agent_of, key: str, until_s: float, ms: float = 50) -> str:
    return faults.fault_inject(key=key, kind="db_slow", worker_id=agent_of.pk, until=time.time() + until_s,
                               audit=AUDIT, params={"ms": ms})


@pytest.mark.django_db(transaction=True)
def test_the_server_and_its_backends_are_stopped_in_a_duty_cycle_until_the_agents_deadline(agent_of, stand_in):
    parent, child, _ = stand_in
    assert _inject(agent_of, "slow-pg", until_s=8) == "throttled"
    injected = Action.objects.get(idempotency_key=faults.injected_key("slow-pg"))
    assert injected.result["database"] == "postgresql" and injected.result["db_pid"] == parent.pid
    assert injected.result["node"] == agent_of.node.name and injected.result["ms"] == 50
    # Both are stopped and continued, again and again.
    parent_states, child_states = _states(parent.pid, child.pid, seconds=1.0)
    assert "stopped" in parent_states and parent_states & {"running", "sleeping"}, parent_states
    assert "stopped" in child_states and "running" in child_states, child_states
    # Stopped the injected `ms` of each cycle: about half of it (a loaded host's late wake-ups stretch the stopped
    # part).
    stopped = _stopped_share(child.pid, 2.0)
    print(f"db_slow ms=50: the backend was stopped in {stopped:.2f} of its sampled states")
    assert 0.25 < stopped < 0.9, stopped
    # No revert is ever sent: the agent's own timer ends the cycle, with both running.
    reverted = wait_until("the revert row", lambda: Action.objects.filter(
        idempotency_key=faults.reverted_key("slow-pg")).first(), timeout=30)
    assert reverted.result["outcome"] == "released" and reverted.result["by"] == "the agent's deadline"
    assert all("stopped" not in states for states in _states(parent.pid, child.pid, seconds=0.5))
    assert fault_holds.paused_keys() == [] and control_faults._throttles == {}


@pytest.mark.django_db(transaction=True)
def test_a_revert_ends_the_cycle_with_every_process_running(agent_of, stand_in):
    parent, child, _ = stand_in
    assert _inject(agent_of, "slow-revert", until_s=60, ms=90) == "throttled"
    wait_until("the backend to stop", lambda: process_state(child.pid) == "stopped", timeout=5)
    assert faults.fault_revert(key="slow-revert", kind="db_slow", worker_id=agent_of.pk, audit=AUDIT) == "released"
    assert all("stopped" not in states for states in _states(parent.pid, child.pid, seconds=0.5))
    assert fault_holds.paused_keys() == [] and control_faults._throttles == {}


@pytest.mark.django_db(transaction=True)
def test_an_agent_that_restarts_continues_the_server_its_predecessor_left_stopped(agent_of, stand_in):
    parent, child, _ = stand_in
    assert _inject(agent_of, "slow-restart", until_s=60, ms=90) == "throttled"
    # The agent dies in the stopped part of a cycle: its timer and its thread with it.
    with fault_holds.held_lock:
        fault_holds.held.pop("slow-restart").timer.cancel()
    with control_faults._throttles_lock:
        throttle = control_faults._throttles.pop("slow-restart")
    throttle.halt.set()
    throttle.join(timeout=10)
    for process in (parent, child):
        process.send_signal(signal.SIGSTOP)
    assert fault_resume.faults_resume_after_restart(node_name=agent_of.node.name) == ["slow-restart"]
    wait_until("both to run again", lambda: _running(parent.pid, child.pid), timeout=10)
    reverted = Action.objects.get(idempotency_key=faults.reverted_key("slow-restart"))
    assert reverted.result["outcome"] == "released" and reverted.result["by"] == "the agent's restart"
    assert fault_resume.faults_resume_after_restart(node_name=agent_of.node.name) == []


@pytest.mark.django_db(transaction=True)
def test_an_agent_that_exits_leaves_nothing_stopped(agent_of, stand_in):
    parent, child, _ = stand_in
    assert _inject(agent_of, "slow-exit", until_s=60, ms=90) == "throttled"
    wait_until("the backend to stop", lambda: process_state(child.pid) == "stopped", timeout=5)
    control_faults._throttles_end()  # what atexit runs when the agent exits
    assert all("stopped" not in states for states in _states(parent.pid, child.pid, seconds=0.5))
    faults.fault_revert(key="slow-exit", kind="db_slow", worker_id=agent_of.pk, audit=AUDIT)


@pytest.mark.django_db(transaction=True)
def test_a_database_on_another_host_is_refused(agent_of, monkeypatch):
    monkeypatch.setattr(control_faults, "database_here",
                        lambda: {"database": "postgresql", "host": "db.elsewhere.example", "port": 5432})
    assert _inject(agent_of, "slow-away", until_s=30) == "failed"
    error = Action.objects.get(idempotency_key=faults.injected_key("slow-away")).result["error"]
    assert "not on this host" in error and fault_holds.paused_keys() == []


def _write(path, timeout: float) -> float:
    """One write transaction, as the control plane's (IMMEDIATE); its seconds."""
    began = time.monotonic()
    connection = sqlite3.connect(path, timeout=timeout, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("INSERT INTO t VALUES (1)")
        connection.execute("COMMIT")
    finally:
        connection.close()
    return time.monotonic() - began


def _is_locked(path) -> bool:
    try:
        _write(path, timeout=0)
        return False
    except sqlite3.OperationalError as exc:
        assert "locked" in str(exc)
        return True


@pytest.fixture
def sqlite_file(monkeypatch, tmp_path):
    """A database file of this test's own, in WAL mode as the control plane's; the agent's database is it."""
    path = str(tmp_path / "slow.sqlite3")
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("CREATE TABLE t (n INTEGER)")
    monkeypatch.setattr(control_faults, "database_here", lambda: {"database": "sqlite", "path": path})
    return path


def _writes(path) -> float:
    """The mean seconds of 20 writes, at random moments of the cycle (as the control plane's arrive)."""
    waits = []
    for _ in range(20):
        waits.append(_write(path, timeout=5))
        time.sleep(random.uniform(0, 0.1))  # spreads the writes over the cycle
    return sum(waits) / len(waits)


@pytest.mark.django_db(transaction=True)
def test_on_sqlite_a_writer_waits_while_the_agent_holds_the_write_lock(agent_of, sqlite_file):
    before = _writes(sqlite_file)
    assert _inject(agent_of, "slow-sqlite", until_s=60, ms=50) == "throttled"
    wait_until("the write lock to be held", lambda: _is_locked(sqlite_file), timeout=10)
    # A writer with a busy timeout (as the control plane's) waits for the held part of a cycle, then writes.
    during = _writes(sqlite_file)
    print(f"db_slow ms=50 on SQLite: a write took {during * 1000:.1f} ms on average, {before * 1000:.1f} ms before "
          "(loaded host)")
    assert during > before + 0.005, (before, during)
    assert faults.fault_revert(key="slow-sqlite", kind="db_slow", worker_id=agent_of.pk, audit=AUDIT) == "released"
    assert not any(_is_locked(sqlite_file) for _ in range(50))
    assert fault_holds.paused_keys() == [] and control_faults._throttles == {}


@pytest.mark.django_db(transaction=True)
def test_on_sqlite_more_than_half_of_each_cycle_is_refused(agent_of, sqlite_file):
    assert _inject(agent_of, "slow-sqlite-90", until_s=60, ms=90) == "failed"
    error = Action.objects.get(idempotency_key=faults.injected_key("slow-sqlite-90")).result["error"]
    assert "at most 50" in error and not _is_locked(sqlite_file) and fault_holds.paused_keys() == []
