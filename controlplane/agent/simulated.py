"""A simulated fleet: one process that is the node agent of many simulated nodes.

Everything the control plane sees is real: each node is a Node row that registers and heartbeats, each consumes
its own Celery queue `node.<name>` (one Celery worker consumes them all), workers are started and stopped by the
same agent tasks (`controlplane.agent.workers`) and answer /health and /metrics over real HTTP on their own ports.
Only the worker processes are replaced: a simulated worker (`inference.worker.sim`) lives in one of a few
simulated worker hosts (`python -m inference.worker.sim_host`), since a thousand worker interpreters would not fit
a small machine; `SimulatedProcesses` spawns, checks and stops them through the hosts' control API with the
meaning `controlplane.agent.processes` gives real processes, and signals them for the chaos faults (`signal_group`:
kill, stop, continue) through the hosts' control API. Anything else the agent starts (a deployment's gateway)
runs as a real process.

With one process for many nodes, the agent tasks do not check that a task reached its own node's agent
(`runtime.node_name` is None); the queues still route each task by the row's node.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

import requests
from django.conf import settings
from django.db import close_old_connections

from controlplane.agent import processes
from controlplane.agent.processes import ProcessHandle
from inference.worker_secret import SECRET_ENV

log = logging.getLogger(__name__)

HOST_MODULE = "inference.worker.sim_host"
WORKER_MODULE = "inference.worker"
PID_BASE, PID_SPAN = 1_000_000_000, 10_000_000  # as inference.worker.sim_host numbers its virtual pids
LISTING_MAX_AGE_S = 1.0  # a heartbeat round checks every worker: one listing per host serves them all
HTTP_TIMEOUT_S = 10.0
STOP_POLL_S = 0.2


class SimHostError(RuntimeError):
    """A simulated worker host refused or did not answer."""


class SimulatedProcesses:
    """The agent's launcher for simulated workers: `processes`' functions, over simulated worker hosts."""

    def __init__(self, host_urls: list[str]):
        self.host_urls = host_urls
        self.session = requests.Session()
        self._lock = threading.Lock()
        self._listings: dict[int, tuple[float, dict[int, float]]] = {}  # host -> (fetched at, {pid: started_at})
        self._spawned: dict[int, tuple[float, float]] = {}  # pid -> (started_at, spawned at): newer than a listing
        self._exited: dict[int, int] = {}  # pid -> exit code, until reaped
        self._exit_codes: dict[int, int] = {}
        self._load = [0] * len(host_urls)

    # -- which host --------------------------------------------------------------------------------------------------

    @staticmethod
    def is_simulated(pid: int) -> bool:
        return pid >= PID_BASE

    def _host_of(self, pid: int) -> int:
        return (pid - PID_BASE) // PID_SPAN

    def _listing(self, host: int, *, fresh: bool = False) -> dict[int, float]:
        with self._lock:
            at, workers = self._listings.get(host, (0.0, {}))
        if fresh or time.monotonic() - at > LISTING_MAX_AGE_S:
            fetched_at = time.monotonic()
            try:
                answer = self.session.get(f"{self.host_urls[host]}/workers", timeout=HTTP_TIMEOUT_S).json()
            except (requests.RequestException, ValueError) as exc:
                log.warning("simulated worker host %d did not answer: %s", host, exc)
                answer = {"workers": [], "exited": {}}  # its workers are as good as dead
            workers = {w["pid"]: w["started_at"] for w in answer["workers"]}
            with self._lock:
                self._listings[host] = (fetched_at, workers)
                for pid, code in answer["exited"].items():
                    self._exited[int(pid)] = self._exit_codes[int(pid)] = code
                self._load[host] = len(workers)
        return workers

    # -- the processes API -------------------------------------------------------------------------------------------

    def spawn(self, argv: list[str], *, log_path: Path, marker: str | None, env: dict[str, str] | None = None,
              cwd: Path | None = None, die_with_parent: bool = False) -> ProcessHandle:
        """A simulated worker on the least loaded host; anything else (a gateway) as a real process."""
        if WORKER_MODULE not in argv or "--simulate" not in argv:
            return processes.spawn(argv, log_path=log_path, marker=marker, env=env, cwd=cwd,
                                   die_with_parent=die_with_parent)
        flags = argv[argv.index(WORKER_MODULE) + 1:]
        with self._lock:
            host = min(range(len(self.host_urls)), key=lambda i: self._load[i])
            self._load[host] += 1
        try:
            # The worker secret a real process finds in its environment travels in the body, not in argv.
            r = self.session.post(f"{self.host_urls[host]}/workers", timeout=HTTP_TIMEOUT_S, json={
                "id": marker, "argv": flags, "secret": (env or {}).get(SECRET_ENV)})
        except requests.RequestException as exc:
            raise SimHostError(f"simulated worker host {host} unreachable: {exc}") from None
        if r.status_code != 200:
            raise SimHostError(f"simulated worker host {host} refused the worker: HTTP {r.status_code} {r.text[:300]}")
        answer = r.json()
        with self._lock:
            self._spawned[answer["pid"]] = (answer["started_at"], time.monotonic())
        return ProcessHandle(pid=answer["pid"], create_time=answer["started_at"], marker=marker)

    def is_alive(self, handle: ProcessHandle | None) -> bool:
        if handle is None or handle.pid <= 0:
            return False
        if not self.is_simulated(handle.pid):
            return processes.is_alive(handle)
        workers = self._listing(self._host_of(handle.pid))
        started = workers.get(handle.pid)
        if started is None:
            with self._lock:
                spawned = self._spawned.get(handle.pid)
                listed_at = self._listings.get(self._host_of(handle.pid), (0.0, {}))[0]
            if spawned is None or spawned[1] < listed_at:
                return False  # a listing taken after the spawn no longer has it
            started = spawned[0]
        return abs(started - handle.create_time) < processes.CREATE_TIME_TOLERANCE_S

    def stop(self, handle: ProcessHandle, deadline_s: float = 30.0) -> str:
        """Drain (as SIGTERM), close at once after deadline_s (as SIGKILL); blocks until it is gone."""
        if not self.is_simulated(handle.pid):
            return processes.stop(handle, deadline_s=deadline_s)
        if not self.is_alive(handle):
            return "gone"
        host = self._host_of(handle.pid)
        url = f"{self.host_urls[host]}/workers/{handle.marker}"
        try:
            self.session.delete(url, params={"drain_timeout": deadline_s}, timeout=HTTP_TIMEOUT_S)
        except requests.RequestException:
            return "gone"
        deadline = time.monotonic() + deadline_s + 2.0
        while time.monotonic() < deadline:
            if handle.pid not in self._listing(host, fresh=True):
                return "terminated"
            time.sleep(STOP_POLL_S)
        self.session.delete(url, params={"kill": "1"}, timeout=HTTP_TIMEOUT_S)
        return "killed"

    def signal_group(self, handle: ProcessHandle, sig: int) -> bool:
        """What `processes.signal_group` does to a real process, through its host: SIGKILL closes the worker at once
        (it exits -9), SIGSTOP holds it (nothing answered, no progress) and SIGCONT releases it. False when it is
        gone. A hold outlives this agent by at most TANDEM_CHAOS_MAX_DURATION_S: the host releases it then."""
        if not self.is_simulated(handle.pid):
            return processes.signal_group(handle, sig)
        if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT):
            raise ValueError(f"a simulated worker takes SIGKILL, SIGSTOP or SIGCONT, not {signal.Signals(sig).name}")
        if not self.is_alive(handle):
            return False
        url = f"{self.host_urls[self._host_of(handle.pid)]}/workers/{handle.marker}"
        try:
            if sig == signal.SIGKILL:
                r = self.session.delete(url, params={"kill": "1"}, timeout=HTTP_TIMEOUT_S)
            elif sig == signal.SIGSTOP:
                r = self.session.post(f"{url}/pause", json={"seconds": settings.TANDEM_CHAOS_MAX_DURATION_S},
                                      timeout=HTTP_TIMEOUT_S)
            else:
                r = self.session.delete(f"{url}/pause", timeout=HTTP_TIMEOUT_S)
        except requests.RequestException as exc:
            log.warning("simulated worker host of pid %d did not take %s: %s", handle.pid,
                        signal.Signals(sig).name, exc)
            return False
        return r.status_code in (200, 202)

    def reap(self) -> dict[int, int]:
        exited = processes.reap()
        with self._lock:
            exited.update(self._exited)
            self._exited = {}
        return exited

    def exit_code(self, pid: int, create_time: float | None = None) -> int | None:
        if not self.is_simulated(pid):
            return processes.exit_code(pid, create_time)
        with self._lock:
            return self._exit_codes.get(pid)  # virtual pids are never reused

    def group_leftovers_kill(self, handle: ProcessHandle) -> int:
        # A simulated worker has no process group; a real process (a gateway) has its own.
        return 0 if self.is_simulated(handle.pid) else processes.group_leftovers_kill(handle)

    @staticmethod
    def log_tail(log_path, num_lines: int = 15, max_chars: int = 2000, *, handle: ProcessHandle | None = None) -> str:
        # A simulated worker writes none (""); a real process (a gateway) has its own.
        return processes.log_tail(log_path, num_lines, max_chars, handle=handle)

    @staticmethod
    def free_port(host: str = "127.0.0.1") -> int:
        return processes.free_port(host)


def hosts_start(num_hosts: int, *, log_dir: Path) -> tuple[list[processes.ProcessHandle], list[str]]:
    """Start the simulated worker hosts (they die with this process) and wait until each answers."""
    handles, urls = [], []
    for index in range(num_hosts):
        port = processes.free_port()
        handles.append(processes.spawn(processes.python_argv(HOST_MODULE, "--port", str(port), "--index", str(index)),
                                       log_path=log_dir / f"simhost-{index}.log", marker=None,
                                       cwd=settings.BASE_DIR, die_with_parent=True))
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    for handle, url in zip(handles, urls):
        while True:
            try:
                if requests.get(url + "/health", timeout=2).ok:
                    break
            except requests.RequestException:
                pass
            if not processes.is_alive(handle) or time.monotonic() > deadline:
                raise SimHostError(f"simulated worker host {url} did not start (see {log_dir})")
            time.sleep(0.1)
    return handles, urls


# Simulated agents killed by the chaos fault agent_kill: node name -> when its supervisor starts it again (monotonic).
SIM_RESTART_S = 1.0  # a supervisor's first backoff (controlplane.run.stack)
_agents_down: dict[str, float] = {}
_agents_lock = threading.Lock()


def agent_kill(node_name: str) -> None:
    """The simulated agent of `node_name` dies: no heartbeat of that node until it is started again, SIM_RESTART_S
    from now, when it adopts its workers as a restarted agent does (FleetHeartbeat). Its queue is still consumed (one
    Celery worker serves every node of the fleet); its workers, in the simulated hosts, keep serving."""
    with _agents_lock:
        _agents_down[node_name] = time.monotonic() + SIM_RESTART_S


def agent_is_down(node_name: str) -> bool:
    with _agents_lock:
        return node_name in _agents_down


class FleetHeartbeat(threading.Thread):
    """node_heartbeat for every node of the fleet, one round per interval; the round's duration is logged, since it
    is what a simulated fleet costs its own agent. A node whose simulated agent was killed is skipped until its
    restart, which adopts its workers (node_adopt) and then calls `on_agent_restart(node, adopted)`."""

    def __init__(self, nodes: list, interval_s: float, on_agent_restart=None):
        super().__init__(name="fleet-heartbeat", daemon=True)
        self.nodes, self.interval_s = nodes, interval_s
        self.on_agent_restart = on_agent_restart
        self._stop_event = threading.Event()
        self.last_round_s = 0.0

    def _agent_down(self, node) -> bool:
        """True while the node's simulated agent is dead; restarts it once its time has come."""
        from controlplane.agent.node import node_adopt

        with _agents_lock:
            restart_at = _agents_down.get(node.name)
        if restart_at is None:
            return False
        if time.monotonic() < restart_at:
            return True
        adopted = node_adopt(node=node)
        if self.on_agent_restart is not None:
            self.on_agent_restart(node, adopted)
        with _agents_lock:
            _agents_down.pop(node.name, None)
        return False

    def run(self) -> None:
        from django.utils import timezone

        from controlplane.agent.node import node_heartbeat
        from controlplane.models import Node

        while not self._stop_event.wait(max(0.0, min(self.interval_s - self.last_round_s,
                                                     SIM_RESTART_S if _agents_down else self.interval_s))):
            started = time.monotonic()
            close_old_connections()
            live = []
            for node in self.nodes:
                try:
                    if not self._agent_down(node):
                        live.append(node)
                except Exception:
                    log.exception("the restart of node %s's agent failed", node.name)
            # Each real agent beats on its own host, first thing in its round, whatever the others' rounds take:
            # one round of many nodes in this one thread must not hold the last node's beat behind the others'
            # repairs (on a loaded host a round outlasted the offline threshold and every node read as offline, so
            # nothing was placed).
            Node.objects.filter(id__in=[node.id for node in live]).update(last_seen_at=timezone.now())
            for node in live:
                try:
                    node_heartbeat(node=node)
                except Exception:
                    log.exception("heartbeat of node %s failed", node.name)
            self.last_round_s = time.monotonic() - started
            if self.last_round_s > self.interval_s:
                log.warning("a heartbeat round of %d nodes took %.2f s (interval %.1f s)", len(self.nodes),
                            self.last_round_s, self.interval_s)

    def stop(self) -> None:
        self._stop_event.set()
