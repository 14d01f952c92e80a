"""Faults on the control plane and on the node agent itself, carried out by a node agent: `broker_freeze` (the Celery
broker hangs, accepting and passing nothing, until the deadline), `db_slow` (every statement of the control plane's
database takes longer until the deadline) and `agent_kill` (SIGKILL this node's agent; its supervisor starts it
again). faults.py records their rows and holds a freeze's or a throttle's deadline timer as for its other faults.

broker_freeze, by where the broker is (controlplane.lib.broker.broker_location of CELERY_BROKER_URL):
- filesystem:// (one machine): the agent holds the exclusive flock of the broker's freeze.lock, which every client of
  the folder passes as a gate: each put and get waits. Released at the deadline by the agent's timer, or by the
  kernel when the agent dies: a frozen folder never outlives its agent.
- Redis or RabbitMQ on this host: SIGSTOP the process that listens on the broker's port (psutil's net_connections;
  it must be this agent's user's to signal), SIGCONT at the deadline. An agent restarted meanwhile thaws it at once
  from its injected row (fault_resume_after_restart): its timer died with the old agent, and no revert message can
  reach it through a frozen broker.
- A broker on another host: refused ("failed"); the chaos app sends the fault to an agent of the broker's host, and
  answers 400 when no node has one (controlplane.chaos.fault_checks.broker_freeze_carrier).

db_slow, by the database (settings.DATABASES["default"]): PostgreSQL has no statement-delay setting, so the server is
throttled from outside as cpulimit does: a thread of this agent SIGSTOPs the postmaster that listens on the database's
port on this host, then its children (the backends, found again each cycle), for `ms` out of every 100 ms, and
SIGCONTs them for the rest. Every statement in flight or arriving waits for the stopped part of each cycle. Its
last act is always SIGCONT: at the deadline or a revert (the thread stops), at this agent's exit (atexit), and an
agent restarted meanwhile SIGCONTs the recorded postmaster and its children from its injected row. On the embedded
SQLite: a connection of this agent holds the file's write lock (BEGIN IMMEDIATE, nothing written) for `ms` (at most
SQLITE_MAX_MS) out of every 100 ms on average, so that writers (IMMEDIATE transactions, settings.py) wait at BEGIN
within their busy timeout; readers (WAL) do not wait. Safe: the holder never writes, so no lock upgrade can
deadlock, and the kernel drops the lock with a dead agent. A database on another host, or of another engine: refused
("failed"); the chaos app sends it to an agent of the database's host (controlplane.chaos.fault_checks.db_slow_carrier).

agent_kill: SIGKILL this process once its injected row is written. Worker processes run in sessions of their own with
no parent-death signal (processes.spawn), so they keep serving; the agent its supervisor starts again (`make run`'s
Stack, systemd's Restart=) adopts them (node.node_adopt) and writes the revert row, `restarted`. Nothing restarts an
agent that runs unsupervised: then no revert row comes, and the run's report says the fault was not reverted. In a
simulated fleet (one agent process for many nodes) the node's agent dies in simulation (simulated.agent_kill): its
heartbeats stop for SIM_RESTART_S, then it adopts its workers again as a restarted agent does.
"""
from __future__ import annotations

import atexit
import fcntl
import logging
import os
import random
import signal
import socket
import sqlite3
import threading
import time

import psutil
from django.conf import settings

from controlplane.agent import runtime, simulated
from controlplane.lib.broker import broker_location, freeze_lock_path

log = logging.getLogger(__name__)

PERIOD_S = 0.1  # db_slow's duty cycle: stopped `ms` of every 100 ms
# SQLite's busy handler polls a held lock at growing intervals, up to 100 ms: held longer than half of each cycle, or
# in a cycle of a fixed period (the polls land in the held part again and again), writers starved past their busy
# timeout ("database is locked") in a probe. So on SQLite: ms at most this, and each cycle's period drawn in 50..150 ms.
SQLITE_MAX_MS = 50
LOCK_TIMEOUT_S = 5.0  # to take the freeze lock: clients hold it shared for microseconds at a time
_locks: dict[str, int] = {}  # fault key -> the descriptor holding the freeze lock of a filesystem broker


class FreezeFailed(RuntimeError):
    """The broker cannot be frozen from here (another host's, not ours to signal, already frozen)."""


def broker_here() -> dict:
    return broker_location(settings.CELERY_BROKER_URL, getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None))


def is_local(host: str) -> bool:
    """Whether `host` (a broker URL's) names this machine."""
    if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0", ""):
        return True
    if host in (socket.gethostname(), socket.getfqdn()):
        return True
    return any(address.address == host for addresses in psutil.net_if_addrs().values() for address in addresses)


def _listener(port: int) -> psutil.Process | None:
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                return psutil.Process(conn.pid)
            except psutil.NoSuchProcess:
                continue
    return None


def _signal_local_server(what: str, host: str, port: int, sig: int) -> tuple[psutil.Process, float]:
    """The process of `what` (the broker, the database) listening on `port` of this host, sent `sig`, and its create
    time; FreezeFailed naming why when it is elsewhere, not seen or not ours to signal."""
    if not is_local(host):
        raise FreezeFailed(f"the {what} ({host}:{port}) is not on this host")
    process = _listener(port)
    if process is None:
        raise FreezeFailed(f"no process that this agent may see listens on port {port} here (the {what} runs as "
                           "another user?)")
    try:
        started = process.create_time()
        process.send_signal(sig)
    except psutil.AccessDenied:
        raise FreezeFailed(f"the {what}'s process {process.pid} is not this agent's user's to signal") from None
    except psutil.NoSuchProcess:
        raise FreezeFailed(f"the {what}'s process {process.pid} exited") from None
    return process, started


def freeze_start(*, key: str, kind, worker, until: float, params: dict) -> tuple[dict, None]:
    """Freeze the broker, or throttle the database (db_slow); `kind` its fault_kinds.FaultKind, `params` with the
    carrier's `node`. Returns what freeze_stop needs (also the injected row's result), and no process of its own:
    the deadline is the agent's timer's."""
    state = _throttle_start(key=key, ms=float(params["ms"])) if kind.name == "db_slow" else _broker_freeze(key)
    return {**state, **params}, None


def _broker_freeze(key: str) -> dict:
    where = broker_here()
    if where["scheme"] == "filesystem":
        path = freeze_lock_path(where["folder"])
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise FreezeFailed(f"{path} stayed locked for {LOCK_TIMEOUT_S:g} s (frozen already?)") from None
                time.sleep(0.01)
        _locks[key] = fd
        return {"broker": "filesystem", "lock": path}
    if "port" not in where:
        raise FreezeFailed(f"a {where['scheme']} broker has no port to find its process by")
    process, started = _signal_local_server("broker", where["host"], where["port"], signal.SIGSTOP)
    return {"broker": where["scheme"], "broker_pid": process.pid, "broker_started": started, "port": where["port"]}


def freeze_stop(*, key: str, state: dict, worker_id: int | None = None) -> str:
    """Thaw the broker: "thawed", or "gone" (its process is not the one frozen any more); end a database's throttle:
    "released" or "gone". (`worker_id`: every kind's stop takes it; the broker and the database need none.)"""
    if "database" in state:
        return _throttle_stop(key=key, state=state)
    if state.get("broker") == "filesystem":
        fd = _locks.pop(key, None)
        if fd is not None:  # else its agent died, and the kernel dropped the lock with it
            os.close(fd)
        return "thawed"
    try:
        process = psutil.Process(state["broker_pid"])
        if abs(process.create_time() - state["broker_started"]) > 0.05:
            return "gone"
        process.send_signal(signal.SIGCONT)
    except (KeyError, psutil.Error):
        return "gone"
    return "thawed"


def database_here() -> dict:
    """The control plane's database, as db_slow finds it: {"database": "sqlite", "path"} or {"database":
    "postgresql", "host", "port"} (another engine: {"database": its name})."""
    db = settings.DATABASES["default"]
    engine = db["ENGINE"].rsplit(".", 1)[-1]
    if engine == "sqlite3":
        return {"database": "sqlite", "path": str(db["NAME"])}
    if engine.startswith("postgresql"):
        return {"database": "postgresql", "host": db.get("HOST") or "localhost", "port": int(db.get("PORT") or 5432)}
    return {"database": engine}


class _Throttle(threading.Thread):
    """The duty cycle: hold() for stopped_s of every PERIOD_S, let_go() for the rest; let_go() is its last act."""

    def __init__(self, key: str, stopped_s: float, hold, let_go, close=lambda: None, jitter: bool = False):
        super().__init__(name=f"db-slow {key}", daemon=True)  # daemon: atexit (_throttles_end) stops it first
        self.stopped_s, self.hold, self.let_go, self.close, self.jitter = stopped_s, hold, let_go, close, jitter
        self.halt = threading.Event()

    def end(self, timeout: float) -> None:
        self.halt.set()
        self.join(timeout=timeout)
        self.let_go()  # again: harmless, and sure even if the thread did not end in time
        self.close()

    def run(self):
        try:
            while not self.halt.is_set():
                began, scale = time.monotonic(), random.uniform(0.5, 1.5) if self.jitter else 1.0
                try:
                    self.hold()
                    self.halt.wait(self.stopped_s * scale)
                finally:
                    self.let_go()
                self.halt.wait(max(0.0, PERIOD_S * scale - (time.monotonic() - began)))
        except Exception:  # a process that went away, a file that cannot be locked: the cycle ends, let go
            log.exception("db_slow %s: the throttle stopped", self.name)
        finally:
            self.let_go()


_throttles: dict[str, _Throttle] = {}  # fault key -> its running duty cycle
_throttles_lock = threading.Lock()


def _server_processes(postmaster: psutil.Process) -> list[psutil.Process]:
    try:
        return [postmaster, *postmaster.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _signal_all(processes: list[psutil.Process], signum: int) -> int:
    """Signal each; returns how many were signalled (a backend that exited meanwhile is skipped)."""
    signalled = 0
    for process in processes:
        try:
            process.send_signal(signum)  # psutil checks that the pid is still this process, not one reusing it
            signalled += 1
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # exited meanwhile; another user's helper process
            continue
    return signalled


def _postgres_hold(postmaster: psutil.Process):
    held: list[psutil.Process] = []

    def hold():
        # The postmaster first: stopped, it forks no backend that the list below would miss.
        _signal_all([postmaster], signal.SIGSTOP)
        held[:] = _server_processes(postmaster)
        _signal_all(held[1:], signal.SIGSTOP)

    def let_go():
        _signal_all(held or [postmaster], signal.SIGCONT)
        held.clear()

    return hold, let_go


def _sqlite_hold(path: str, stopped_s: float):
    # mode=rw: never create a database file; the busy timeout is shorter than the hold, so that a writer who holds
    # the lock now costs a cycle, never a queue of them.
    connection = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=stopped_s, isolation_level=None,
                                 check_same_thread=False)
    lock = threading.Lock()  # the thread and atexit may both let go

    def hold():
        with lock:
            try:
                connection.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:  # "database is locked": a writer holds it this cycle
                pass

    def let_go():
        with lock:
            if connection.in_transaction:
                connection.execute("ROLLBACK")

    return hold, let_go, connection.close


def _throttle_start(*, key: str, ms: float) -> dict:
    where, stopped_s = database_here(), ms / 1000
    if not 0 < stopped_s < PERIOD_S:
        raise FreezeFailed(f"ms must be in 1..90 (of every {PERIOD_S * 1000:g} ms), not {ms:g}")
    if where["database"] == "sqlite":
        if ms > SQLITE_MAX_MS:
            raise FreezeFailed(f"on SQLite, ms must be at most {SQLITE_MAX_MS}: writers that poll a lock held longer "
                               "starve")
        if not os.path.isfile(where["path"]):
            raise FreezeFailed(f"the SQLite database {where['path']} is not a file on this host")
        try:
            cycle = _sqlite_hold(where["path"], stopped_s)
        except sqlite3.Error as exc:
            raise FreezeFailed(f"the SQLite database {where['path']} cannot be opened here: {exc}") from None
        state = {"database": "sqlite", "path": where["path"]}
    elif where["database"] == "postgresql":
        # SIGCONT is harmless: it asks whether this agent may signal the postmaster at all.
        postmaster, started = _signal_local_server("database", where["host"], where["port"], signal.SIGCONT)
        cycle = _postgres_hold(postmaster)
        state = {"database": "postgresql", "db_pid": postmaster.pid, "db_started": started, "port": where["port"]}
    else:
        raise FreezeFailed(f"a {where['database']} database cannot be slowed (PostgreSQL or SQLite only)")
    throttle = _Throttle(key, stopped_s, *cycle, jitter=where["database"] == "sqlite")
    with _throttles_lock:
        if key in _throttles:
            raise FreezeFailed(f"{key} throttles the database already")
        _throttles[key] = throttle
    throttle.start()
    return state


def _throttle_stop(*, key: str, state: dict) -> str:
    """End the duty cycle (its last act is SIGCONT or ROLLBACK). A throttle this process does not run (its agent
    died in the stopped part of a cycle) gets SIGCONT on the recorded postmaster and its children all the same."""
    with _throttles_lock:
        throttle = _throttles.pop(key, None)
    if throttle is not None:
        throttle.end(timeout=10)
    if state.get("database") != "postgresql":
        return "released"  # SQLite: the lock went with its connection's process, or with the rollback above
    try:
        postmaster = psutil.Process(state["db_pid"])
        if abs(postmaster.create_time() - state["db_started"]) > 0.05:
            return "gone"
    except (KeyError, psutil.Error):
        return "gone"
    _signal_all(_server_processes(postmaster), signal.SIGCONT)
    return "released"


@atexit.register
def _throttles_end() -> None:
    """At this agent's exit: no database is left stopped or locked by a duty cycle that dies with it."""
    with _throttles_lock:
        throttles = list(_throttles.values())
        _throttles.clear()
    for throttle in throttles:
        throttle.end(timeout=2)


def agent_kill(node_name: str) -> None:
    """SIGKILL this agent (never returns), or in a simulated fleet kill the node's simulated agent."""
    if runtime.simulated:
        simulated.agent_kill(node_name)
        return
    log.warning("node agent %s (pid %d) kills itself: a chaos fault", node_name, os.getpid())
    logging.shutdown()
    os.kill(os.getpid(), signal.SIGKILL)


def agent_is_down(node_name: str) -> bool:
    """A simulated agent killed and not started again yet (a real one that is down runs no code to ask)."""
    return runtime.simulated and simulated.agent_is_down(node_name)
