"""Faults on the control plane and on the node agent itself, carried out by a node agent: `broker_freeze` (the Celery
broker hangs, accepting and passing nothing, until the deadline) and `agent_kill` (SIGKILL this node's agent; its
supervisor starts it again). faults.py records their rows and holds a freeze's deadline timer as for its other faults.

broker_freeze, by where the broker is (controlplane.lib.broker.broker_location of CELERY_BROKER_URL):
- filesystem:// (one machine): the agent holds the exclusive flock of the broker's freeze.lock, which every client of
  the folder passes as a gate: each put and get waits. Released at the deadline by the agent's timer, or by the
  kernel when the agent dies: a frozen folder never outlives its agent.
- Redis or RabbitMQ on this host: SIGSTOP the process that listens on the broker's port (psutil's net_connections;
  it must be this agent's user's to signal), SIGCONT at the deadline. An agent restarted meanwhile thaws it at once
  from its injected row (fault_resume_after_restart): its timer died with the old agent, and no revert message can
  reach it through a frozen broker.
- A broker on another host: refused ("failed"); the chaos app sends the fault to an agent of the broker's host, and
  answers 400 when no node has one (controlplane.chaos.validation.broker_freeze_carrier).

agent_kill: SIGKILL this process once its injected row is written. Worker processes run in sessions of their own with
no parent-death signal (processes.spawn), so they keep serving; the agent its supervisor starts again (`make run`'s
Stack, systemd's Restart=) adopts them (node.node_adopt) and writes the revert row, `restarted`. Nothing restarts an
agent that runs unsupervised: then no revert row comes, and the run's report says the fault was not reverted. In a
simulated fleet (one agent process for many nodes) the node's agent dies in simulation (simulated.agent_kill): its
heartbeats stop for SIM_RESTART_S, then it adopts its workers again as a restarted agent does.
"""
from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import time

import psutil
from django.conf import settings

from controlplane.agent import runtime, simulated
from controlplane.lib.broker import broker_location, freeze_lock_path

log = logging.getLogger(__name__)

CONTROL_KINDS = ("broker_freeze", "agent_kill")
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


def freeze_start(*, key: str) -> dict:
    """Freeze the broker; returns what freeze_stop needs (also the injected row's result)."""
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
    if not is_local(where["host"]):
        raise FreezeFailed(f"the broker ({where['host']}:{where['port']}) is not on this host")
    process = _listener(where["port"])
    if process is None:
        raise FreezeFailed(f"no process that this agent may see listens on port {where['port']} here (the broker "
                           "runs as another user?)")
    try:
        started = process.create_time()
        process.send_signal(signal.SIGSTOP)
    except psutil.AccessDenied:
        raise FreezeFailed(f"the broker's process {process.pid} is not this agent's user's to signal") from None
    except psutil.NoSuchProcess:
        raise FreezeFailed(f"the broker's process {process.pid} exited") from None
    return {"broker": where["scheme"], "broker_pid": process.pid, "broker_started": started, "port": where["port"]}


def freeze_stop(*, key: str, state: dict) -> str:
    """Thaw the broker: "thawed", or "gone" (its process is not the one frozen any more)."""
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
