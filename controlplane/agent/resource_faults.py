"""The resource faults `cpu_hog` and `memory_pressure`: the node agent starts a hog on the target worker's host for the
fault's duration, and stops it at the end, on an abort, or at its deadline.

The hog is `stress-ng` where it is installed (Debian's package) and otherwise `python controlplane/agent/hog.py`,
either one run under coreutils' `timeout`, and each carries the deadline itself (`--timeout`, `--until`): a hog
outlives neither its deadline nor a dead agent, broker or control plane (it is never a die-with-parent child, so an
agent restart does not end it early either). What a later revert needs (the hog's pid and create time) is on the
injected Action row's result, so that an agent restarted meanwhile can stop it (as a proxy fault is undone).

memory_pressure is bounded here as well as by the API (controlplane.chaos.validation, from the node's registered
memory): at most MEMORY_FRACTION of the memory the host has available when the fault arrives.
"""
from __future__ import annotations

import logging
import math
import shutil
import signal
import sys
import time
from pathlib import Path

import psutil
from django.conf import settings

from controlplane.agent import processes

log = logging.getLogger(__name__)

RESOURCE_KINDS = ("cpu_hog", "memory_pressure")
HOG_SCRIPT = Path(__file__).with_name("hog.py")
MEMORY_FRACTION = 0.5  # of the host's available memory, at most, for one memory_pressure fault
GRACE_S = 5  # `timeout` SIGKILLs the hog this long after its own deadline, should it not have exited


class ResourceRefused(Exception):
    pass


def marker_of(key: str) -> str:
    return f"resource-fault:{key}"


def stress_ng() -> str | None:
    return shutil.which("stress-ng")


def hog_argv(kind: str, params: dict, until: float, *, tool: str | None) -> list[str]:
    """The command of one hog: stress-ng when `tool` names it, else the Python hog; under `timeout` either way."""
    seconds = max(1, math.ceil(until - time.time()))
    if tool is not None:
        if kind == "cpu_hog":
            inner = [tool, "--cpu", str(int(params.get("workers", 1))), "--cpu-method", "loop"]
        else:
            inner = [tool, "--vm", "1", "--vm-bytes", f"{int(params['mib'])}M", "--vm-keep"]
        inner += ["--timeout", f"{seconds}s", "--quiet"]
    else:
        what = ["--cpu", str(int(params.get("workers", 1)))] if kind == "cpu_hog" \
            else ["--memory-mib", str(int(params["mib"]))]
        # The file, not `-m controlplane.agent.hog`: importing the package would start Django and Celery first.
        inner = [sys.executable, str(HOG_SCRIPT), "--until", f"{until:.3f}", *what]
    return ["timeout", "--signal=KILL", f"{seconds + GRACE_S}s", *inner]


def memory_available_mib() -> int:
    return psutil.virtual_memory().available // (1024 * 1024)


def hog_start(*, key: str, kind: str, worker_id: int, until: float, params: dict) -> dict:
    """Start the hog; returns what a revert needs. Raises ResourceRefused for more memory than this host can give
    (naming the field) or a hog that exits at once."""
    if kind == "memory_pressure":
        limit = int(memory_available_mib() * MEMORY_FRACTION)
        if params["mib"] > limit:
            raise ResourceRefused(f"mib: {params['mib']:g} MiB is more than {MEMORY_FRACTION:g} of the memory this "
                                  f"host has available ({limit} MiB)")
    tool = stress_ng()
    argv = hog_argv(kind, params, until, tool=tool)
    log_path = Path(settings.TANDEM_LOG_DIR) / f"resource-fault-worker-{worker_id}.log"
    handle = processes.spawn(argv, log_path=log_path, marker=marker_of(key), cwd=Path(settings.BASE_DIR))
    time.sleep(0.2)  # a hog that cannot start (a bad flag, no memory) exits at once
    if not processes.is_alive(handle):
        raise ResourceRefused(f"the {kind} hog exited at once: {processes.log_tail(log_path, num_lines=5)}")
    used = "stress-ng" if tool else "python"
    log.info("fault %s: %s (%s) on this host, pid %d, until %.1f", key, kind, used, handle.pid, until)
    return {"hog_pid": handle.pid, "hog_started": handle.create_time, "tool": used}


def hog_handle(key: str, state: dict) -> processes.ProcessHandle:
    return processes.ProcessHandle(pid=state["hog_pid"], create_time=state["hog_started"], marker=marker_of(key))


def hog_stop(*, key: str, state: dict) -> str:
    """SIGKILL the hog's process group (`timeout`, the hog and its workers). Returns "stopped", or "gone" when it
    had exited already (its own deadline)."""
    handle = hog_handle(key, state)
    if not processes.signal_group(handle, signal.SIGKILL):
        return "gone"
    processes.wait_exit(handle, 10)
    return "stopped"
