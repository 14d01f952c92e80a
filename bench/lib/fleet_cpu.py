"""Where a fleet bench's CPU goes: two CPU sets, one for the control plane and one for the fleet, and the CPU seconds
each component spent, read from /proc.

On a small machine a simulated fleet (its hosts, gateways and the bench driving them) takes the cores the control
plane is measured on, and the control plane's cost is then a guess. `cpu_sets` splits the CPUs this process may use
in two: the control plane (web, Celery workers, beat, Prometheus) gets the first half, the fleet the rest. A child
is pinned at exec (`pinned`: `taskset -c`), so its threads and children inherit the set, restarts included;
`affinity` pins what a block of code spawns (a child started by code this bench does not own).

CPU seconds are utime + stime of /proc/<pid>/stat, plus cutime + cstime: the children a process forked and reaped
(a shell step, a prefork pool's replaced child) count as its own. A process that ends inside a window loses what it
spent since the window began; `CpuWindow` samples as the window goes, so such a loss is at most one sample's worth.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Iterator

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float | None:
    """utime + stime + cutime + cstime of `pid` in seconds; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow its last ')'.
    fields = text[text.rindex(")") + 2:].split()
    return sum(int(v) for v in fields[11:15]) / CLOCK_TICKS  # fields 14-17: utime, stime, cutime, cstime


def cpu_sets(available: set[int] | None = None) -> tuple[set[int], set[int]] | None:
    """(control plane, fleet): the CPUs this process may use, split in two; None with fewer than two."""
    cpus = sorted(available if available is not None else os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    half = (len(cpus) + 1) // 2
    return set(cpus[:half]), set(cpus[half:])


def cpu_list(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def pinned(argv: list[str], cpus: set[int] | None) -> list[str]:
    """`argv` started on `cpus` (unchanged where None): taskset sets the affinity and execs, so the pid is argv's."""
    if cpus is None:
        return argv
    taskset = shutil.which("taskset")
    if taskset is None:
        raise SystemExit("--pin needs taskset (util-linux); run with --no-pin where it is missing")
    return [taskset, "-c", cpu_list(cpus), *argv]


@contextlib.contextmanager
def affinity(cpus: set[int] | None) -> Iterator[None]:
    """This thread on `cpus` for the block: what it spawns there inherits the set."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def cpus_of(pids: list[int]) -> list[int] | None:
    """The CPUs the given processes may run on (their union); None where none is left."""
    out: set[int] = set()
    for pid in pids:
        try:
            out |= os.sched_getaffinity(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return sorted(out) or None


class CpuWindow:
    """CPU seconds per component over a window. `components()` says which pids make up each component now; it is
    asked again every `refresh_s` (finding processes can cost more than reading their times), so that a process
    started meanwhile is counted from its first sample on."""

    def __init__(self, components: Callable[[], dict[str, list[int]]], refresh_s: float = 10.0):
        self.components, self.refresh_s = components, refresh_s
        self.pids: dict[str, list[int]] = {}
        self.resolved_at = float("-inf")
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.owner: dict[int, str] = {}
        self.started: float | None = None
        self.ended = 0.0

    def sample(self) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        if now - self.resolved_at >= self.refresh_s:
            self.pids, self.resolved_at = self.components(), now
        for name, pids in self.pids.items():
            for pid in pids:
                seconds = proc_cpu_seconds(pid)
                if seconds is None:
                    continue
                self.owner[pid] = name
                self.first.setdefault(pid, seconds)
                self.last[pid] = seconds
        self.ended = time.monotonic()

    def seconds(self) -> dict[str, float]:
        out = {name: 0.0 for name in self.pids}
        for pid, name in self.owner.items():
            out[name] = out.get(name, 0.0) + self.last[pid] - self.first[pid]
        return out

    def report(self, interval_s: float) -> dict:
        """Per component: CPU seconds over the window, per cycle of `interval_s`, and as cores (CPU s / wall s),
        with how many processes it had at the end and which CPUs they were allowed."""
        wall = max(1e-9, self.ended - (self.started or self.ended))
        cycles = wall / interval_s
        out = {}
        for name, seconds in self.seconds().items():
            pids = self.pids.get(name, [])
            out[name] = {"cpu_s": round(seconds, 2), "cpu_s_per_cycle": round(seconds / cycles, 4),
                         "cores": round(seconds / wall, 3), "num_processes": len(pids), "cpus": cpus_of(pids)}
        return out
