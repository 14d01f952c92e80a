"""The resource faults `cpu_hog`, `memory_pressure`, `gpu_memory` and `disk_fill`: the node agent starts a hog on
the target worker's host for the fault's duration (or writes a fill file under its var/ folder), and stops it
(deletes it) at the end, on an abort, or at its deadline.

The hog is `stress-ng` where it is installed (Debian's package) and otherwise `python controlplane/agent/hog.py`,
either one run under coreutils' `timeout`, and each carries the deadline itself (`--timeout`, `--until`): a hog
outlives neither its deadline nor a dead agent, broker or control plane (it is never a die-with-parent child, so an
agent restart does not end it early either). What a later revert needs (the hog's pid and create time; the fill
file's path) is on the injected Action row's result, so that an agent restarted meanwhile can stop it (as a proxy
fault is undone).

gpu_memory's hog is `python controlplane/agent/gpu_hold.py` (torch), on the GPU the fault names (`gpu`: a Node.gpus
index), else the target worker's (Worker.gpu_index), else GPU 0, under `timeout` as the others; the agent waits
until it prints that it holds the memory, and a holder that exits first (no CUDA, less free memory than asked) fails
the fault with its line. Which GPUs a node has, and how much memory each, the API checks at run start.

memory_pressure is bounded here as well as by the API (controlplane.chaos.fault_checks, from the node's registered
memory): at most MEMORY_FRACTION of the memory the host has available when the fault arrives. disk_fill writes one
file, `chaos-disk-fill-<key>.fill` in the agent's var/ folder (its workers, logs and filesystem broker live there),
as large as leaves `free_mib` MiB free on that filesystem, but never more than `max_mib` nor
TANDEM_CHAOS_DISK_FILL_MAX_MIB: on a big disk, the bound is what it writes, not a full disk.
"""
from __future__ import annotations

import errno
import logging
import math
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import psutil
from django.conf import settings

from controlplane.agent import processes, runtime
from controlplane.models import Worker

log = logging.getLogger(__name__)

HOG_SCRIPT = Path(__file__).with_name("hog.py")
GPU_HOLD_SCRIPT = Path(__file__).with_name("gpu_hold.py")
# torch's import and CUDA's initialisation (seconds). No longer than a revert waits for a start that is under way
# (faults._wait_started: proxy_faults.LISTEN_TIMEOUT_S + 5 s), else that revert would find nothing to stop.
GPU_START_TIMEOUT_S = 15.0
MEMORY_FRACTION = 0.5  # of the host's available memory, at most, for one memory_pressure fault
GRACE_S = 5  # `timeout` SIGKILLs the hog this long after its own deadline, should it not have exited
MIB = 1024 * 1024
FILL_PREFIX, FILL_SUFFIX = "chaos-disk-fill-", ".fill"


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


def gpu_of(worker_id: int, params: dict) -> int:
    """The GPU a gpu_memory fault holds memory on: its `gpu`, else the target worker's, else 0."""
    if params.get("gpu") is not None:
        return int(params["gpu"])
    index = Worker.objects.filter(pk=worker_id).values_list("gpu_index", flat=True).first()
    return 0 if index is None else int(index)


def gpu_hold_argv(params: dict, gpu: int, until: float) -> list[str]:
    seconds = max(1, math.ceil(until - time.time()))
    inner = [sys.executable, str(GPU_HOLD_SCRIPT), "--until", f"{until:.3f}", "--mib", str(int(params["mib"])),
             "--gpu", str(gpu)]
    return ["timeout", "--signal=KILL", f"{seconds + GRACE_S}s", *inner]


def _wait_holding(handle: processes.ProcessHandle, log_path: Path) -> str:
    """Wait until the GPU holder prints `holding ...` (its line, returned); ResourceRefused with its last lines
    when it exits first or says nothing for GPU_START_TIMEOUT_S (it is then killed)."""
    deadline = time.monotonic() + GPU_START_TIMEOUT_S
    while time.monotonic() < deadline:
        alive = processes.is_alive(handle)
        lines = processes.log_tail(log_path, num_lines=5, handle=handle).splitlines()
        held = [line for line in lines if line.startswith("holding ")]
        if held:
            return held[-1]
        if not alive:
            raise ResourceRefused(f"the gpu_memory holder exited before it held the memory: {' | '.join(lines)}")
        time.sleep(0.2)
    processes.signal_group(handle, signal.SIGKILL)
    raise ResourceRefused(f"the gpu_memory holder did not hold the memory within {GPU_START_TIMEOUT_S:g} s: "
                          f"{processes.log_tail(log_path, num_lines=5, handle=handle)}")


def memory_available_mib() -> int:
    return psutil.virtual_memory().available // (1024 * 1024)


def hog_start(*, key: str, kind: str, worker_id: int, until: float, params: dict) -> dict:
    """Start the hog; returns what a revert needs. Raises ResourceRefused for more memory than this host can give
    (naming the field), a hog that exits at once, or a GPU holder that exits (or hangs) before it holds the memory."""
    if kind == "memory_pressure":
        limit = int(memory_available_mib() * MEMORY_FRACTION)
        if params["mib"] > limit:
            raise ResourceRefused(f"mib: {params['mib']:g} MiB is more than {MEMORY_FRACTION:g} of the memory this "
                                  f"host has available ({limit} MiB)")
    log_path = Path(settings.TANDEM_LOG_DIR) / f"resource-fault-worker-{worker_id}.log"
    if kind == "gpu_memory":
        gpu = gpu_of(worker_id, params)
        # PCI_BUS_ID: CUDA's index then is NVML's, the one Node.gpus lists and the API checked.
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        handle = processes.spawn(gpu_hold_argv(params, gpu, until), log_path=log_path, marker=marker_of(key),
                                 env=env, cwd=Path(settings.BASE_DIR))
        line = _wait_holding(handle, log_path)
        log.info("fault %s: gpu_memory on GPU %d, pid %d, until %.1f: %s", key, gpu, handle.pid, until, line)
        return {"hog_pid": handle.pid, "hog_started": handle.create_time, "tool": "torch", "gpu": gpu,
                "held": line}
    tool = stress_ng()
    argv = hog_argv(kind, params, until, tool=tool)
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


def fill_path(key: str) -> Path:
    """The fill file of the fault `key`: in var/, named as chaos (`chaos-disk-fill-12-0-w3.fill`)."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", key.removeprefix("chaos-"))
    return Path(settings.VAR_DIR) / f"{FILL_PREFIX}{name}{FILL_SUFFIX}"


def _allocate(fd: int, size: int) -> str:
    """Reserve `size` bytes of the file: posix_fallocate (milliseconds, nothing written), else written (a filesystem
    without fallocate); random bytes, so that a compressing filesystem stores them all. Returns how."""
    if size == 0:
        return "none"
    try:
        os.posix_fallocate(fd, 0, size)
        return "fallocate"
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
            raise
    chunk = os.urandom(MIB)
    written = 0
    while written < size:
        written += os.write(fd, chunk[:min(MIB, size - written)])
    os.fsync(fd)
    return "write"


def fill_start(*, key: str, params: dict, node: str | None) -> dict:
    """Write the fill file: as much as leaves `free_mib` free on var/'s filesystem, at most `max_mib` and the
    setting's bound (nothing when less is free already). Returns what a revert needs and what it did; raises
    ResourceRefused when the file cannot be written (no partial file is left)."""
    path = fill_path(key)
    free_before = shutil.disk_usage(path.parent).free
    bound = min(int(params["max_mib"]), settings.TANDEM_CHAOS_DISK_FILL_MAX_MIB) * MIB
    size = max(0, min(bound, free_before - int(params["free_mib"]) * MIB)) // MIB * MIB
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            method = _allocate(fd, size)
        finally:
            os.close(fd)
    except OSError as exc:
        path.unlink(missing_ok=True)
        raise ResourceRefused(f"the fill file {path} was not written ({size // MIB} MiB): {exc}") from None
    free_after = shutil.disk_usage(path.parent).free
    log.info("fault %s: %s written (%d MiB, %s); %d MiB free before, %d after", key, path, size // MIB, method,
             free_before // MIB, free_after // MIB)
    return {"fill_path": str(path), "fill_mib": size // MIB, "method": method, "node": node,
            "free_mib_before": free_before // MIB, "free_mib_after": free_after // MIB}


def fill_remove(*, key: str, state: dict) -> str:
    """Delete the fill file. Returns "removed", or "gone" when it was not there."""
    path = Path(state["fill_path"])
    # The path comes from a row: never delete anything but a fill file.
    if not (path.name.startswith(FILL_PREFIX) and path.name.endswith(FILL_SUFFIX)):
        log.error("fault %s: %s is not a fill file: not deleted", key, path)
        return "gone"
    try:
        path.unlink()
    except FileNotFoundError:
        return "gone"
    log.info("fault %s: %s deleted", key, path)
    return "removed"


def resource_start(*, key: str, kind, worker: Worker, until: float,
                   params: dict) -> tuple[dict, processes.ProcessHandle | None]:
    """Start a resource fault (`kind` its fault_kinds.FaultKind) on this host: its state (what a revert needs) and
    the hog's process (None: a fill file)."""
    if kind.name == "disk_fill":
        return fill_start(key=key, params=params, node=runtime.node_name), None
    state = hog_start(key=key, kind=kind.name, worker_id=worker.id, until=until, params=params)
    return state, hog_handle(key, state)


def resource_stop(*, key: str, state: dict, worker_id: int | None = None) -> str:
    """Undo a resource fault from its state: "stopped" (a hog), "removed" (a fill file) or "gone". (`worker_id`:
    every kind's stop takes it; a host's load needs none.)"""
    if "fill_path" in state:
        return fill_remove(key=key, state=state)
    if "hog_pid" in state:
        return hog_stop(key=key, state=state)
    return "gone"
