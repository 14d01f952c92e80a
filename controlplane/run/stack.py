"""A small process supervisor: start named children, restart one that dies (with backoff), stop them in order.

Used by `manage.py tandem_run` and by the integration tests' stack fixture. Children run in their own sessions,
so a Ctrl-C in the terminal reaches only the supervisor, which then stops them in the order it chooses.
Pure Python (no Django).
"""
from __future__ import annotations

import logging
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.agent import processes

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent.parent
MAX_BACKOFF_S = 30.0
# A child that ran this long before dying is restarted without the accumulated backoff.
STABLE_AFTER_S = 60.0


@dataclass(slots=True)
class ChildSpec:
    name: str
    argv: list[str]
    # SIGTERM → exit deadline when stopping (Celery's warm shutdown waits for running tasks).
    stop_deadline_s: float = 15.0

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name:
            raise ValueError(f"bad child name {self.name!r}")
        if not self.argv:
            raise ValueError(f"child {self.name}: empty command")


@dataclass(slots=True)
class Child:
    spec: ChildSpec
    log_path: Path
    handle: processes.ProcessHandle | None = None
    started_monotonic: float = 0.0
    num_restarts: int = 0
    backoff_s: float = 1.0
    next_start_monotonic: float | None = None
    exits: list[int | None] = field(default_factory=list)


class Stack:
    def __init__(self, specs: list[ChildSpec], *, log_dir: Path, env: dict[str, str], cwd: Path,
                 on_event=None):
        names = [spec.name for spec in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"child names must be unique: {names}")
        self.children = {spec.name: Child(spec, log_dir / f"{spec.name}.log") for spec in specs}
        self.env, self.cwd = env, cwd
        self.on_event = on_event or (lambda message: log.info("%s", message))
        self.stopping = False

    def start(self) -> None:
        for child in self.children.values():
            self._start(child)

    def _start(self, child: Child) -> None:
        child.handle = processes.spawn(child.spec.argv, log_path=child.log_path, marker=None, env=self.env,
                                       cwd=self.cwd, die_with_parent=True)
        child.started_monotonic = time.monotonic()
        child.next_start_monotonic = None

    def pid(self, name: str) -> int | None:
        handle = self.children[name].handle
        return handle.pid if handle is not None else None

    def is_running(self, name: str) -> bool:
        handle = self.children[name].handle
        return handle is not None and processes.is_alive(handle)

    def poll(self) -> list[str]:
        """Restart children that died, each after its backoff. Returns the names restarted now."""
        restarted = []
        if self.stopping:
            return restarted
        now = time.monotonic()
        for child in self.children.values():
            if child.handle is None:
                continue
            if child.next_start_monotonic is None:
                if processes.is_alive(child.handle):
                    continue
                code = processes.exit_code(child.handle.pid)
                child.exits.append(code)
                if now - child.started_monotonic >= STABLE_AFTER_S:
                    child.backoff_s = 1.0
                child.next_start_monotonic = now + child.backoff_s
                self.on_event(f"{child.spec.name} exited (code {code}); restarting in {child.backoff_s:g} s "
                              f"(log: {child.log_path})")
                child.backoff_s = min(child.backoff_s * 2, MAX_BACKOFF_S)
            elif now >= child.next_start_monotonic:
                child.num_restarts += 1
                self._start(child)
                restarted.append(child.spec.name)
        return restarted

    def restart(self, name: str) -> None:
        """Stop one child and start it again at once (tests restart the node agent this way)."""
        stopping = self.stopping
        self.stop([name])
        self.stopping = stopping
        self._start(self.children[name])

    def stop(self, names: list[str] | None = None) -> dict[str, str]:
        """Stop the named children (default: all, in reverse start order), each SIGTERM then SIGKILL."""
        self.stopping = True
        order = names if names is not None else list(reversed(self.children))
        outcome = {}
        # SIGTERM to all of them first, so that their shutdowns overlap, then wait for each in order.
        for name in order:
            child = self.children[name]
            child.next_start_monotonic = None
            if child.handle is not None:
                processes.signal_group(child.handle, signal.SIGTERM)
        for name in order:
            child = self.children[name]
            if child.handle is None:
                outcome[name] = "gone"
            elif processes.wait_exit(child.handle, child.spec.stop_deadline_s):
                outcome[name] = "terminated"
            else:
                processes.signal_group(child.handle, signal.SIGKILL)
                processes.wait_exit(child.handle, 10.0)
                outcome[name] = "killed"
        return outcome


def child_specs(*, web_port: int, node_name: str, var_dir, embedded_beat: bool = False,
                node_labels: dict[str, str] | None = None, python: str = sys.executable) -> list[ChildSpec]:
    """web, control (+ beat) and the agent (registering its node with `node_labels`, the agent's --label); the
    integration tests start the same children."""
    manage = str(ROOT / "manage.py")
    celery = [python, "-m", "celery", "-A", "controlplane"]
    control = [*celery, "worker", "--queues", "control,periodic", "--pool", "threads", "--concurrency", "4",
               "--hostname", f"control.{node_name}@%h", "--without-gossip", "--without-mingle", "--loglevel", "INFO"]
    beat_schedule = str(Path(var_dir) / "celerybeat-schedule")
    if embedded_beat:
        control += ["--beat", "--schedule", beat_schedule]
    specs = [
        # --insecure: runserver serves the static files (plotly, the pages' JS) with debug off too.
        ChildSpec("web", [python, manage, "runserver", f"127.0.0.1:{web_port}", "--noreload", "--insecure"]),
        ChildSpec("control", control, stop_deadline_s=20),
    ]
    if not embedded_beat:
        specs.append(ChildSpec("beat", [*celery, "beat", "--schedule", beat_schedule, "--loglevel", "INFO"]))
    labels = [arg for key, value in (node_labels or {}).items() for arg in ("--label", f"{key}={value}")]
    specs.append(ChildSpec("agent", [python, manage, "tandem_agent", "--name", node_name, *labels],
                           stop_deadline_s=20))
    return specs
