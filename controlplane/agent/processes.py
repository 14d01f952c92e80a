"""Worker processes on this host: spawn in their own session, recognise them again, stop them.

Pure Python (no Django), so that it can be tested with any child process.

A process is identified by (pid, create_time) plus a marker in its environment (TANDEM_WORKER_ID): pids are
recycled, and after an agent restart the only proof that pid 4242 is still *our* worker 17 is that the process that
has that pid now was created at the recorded instant and carries the marker. The worker CLI stays free of
control-plane flags because the marker travels in the environment, not on the command line.

Children start with `start_new_session=True`: a Ctrl-C in the agent's terminal or the agent's own exit does not
reach them, which is what lets a restarted agent re-adopt them. They are stopped by signalling their whole process
group (SIGTERM, then SIGKILL after a deadline) so that anything they spawned goes with them.

How a process ended is known only to its parent: a child of this process is alive until waitpid reaps it (a
SIGKILLed process with many threads shows a zombie main thread for a moment while the others die), so that once it
is not alive its exit code or signal is known, and stays known after a reap. A process that an earlier agent
started (re-adopted) is init's child: its end is seen, its exit status never.

Each process of a log file appends to it after a `--- <time> starting: <argv>` line, so that what one process
wrote can be told from what its predecessors of the same worker wrote.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

MARKER_ENV = "TANDEM_WORKER_ID"
# psutil's create_time is derived from the boot time and jiffies: two reads of the same process agree to well under
# this; a recycled pid practically never lands inside it.
CREATE_TIME_TOLERANCE_S = 0.05
# ...unless the wall clock was stepped in between (NTP, a VM's time sync): the boot time psutil adds (/proc/stat's
# btime) is whole seconds of the wall clock's idea of the boot, so any step can move every process's create_time by
# a whole second at once. A process that carries the handle's marker and reads a whole number of seconds off, at most
# this many, is the same process: taken for dead, an adopted worker was started a second time beside itself (a gateway
# so duplicated keeps its port, with the token its successor's start revoked).
MAX_CLOCK_STEP_S = 2


@dataclass(frozen=True, slots=True)
class ProcessHandle:
    pid: int
    create_time: float  # psutil.Process.create_time(), seconds since the epoch
    marker: str | None = None  # the TANDEM_WORKER_ID the process was started with


@dataclass(slots=True)
class _Child:
    popen: subprocess.Popen
    create_time: float
    marker: str | None
    log_offset: int  # where this process's output begins in its log file
    reaped: bool = False


# Children this process started, by pid: we are their parent, so we must reap them (a zombie keeps its pid and looks
# alive to a naive kill(pid, 0)), and only we can learn their exit status. Processes adopted after an agent restart
# are init's children and need no reaping. Reaped children are kept (the newest NUM_REAPED_KEPT) so that their exit
# status is still known to a report that comes later (a heartbeat whose database write failed tries again).
_children: dict[int, _Child] = {}
_children_lock = threading.Lock()
NUM_REAPED_KEPT = 1024


# Ports handed out lately, and when: a worker binds its port only once it has loaded (seconds later), and the kernel
# picks bind(0)'s port at random, so two starts a moment apart would now and then be told the same port.
PORT_QUARANTINE_S = 300.0
_handed_out: dict[int, float] = {}
_handed_out_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS considers free right now, and not one this process handed out in the last PORT_QUARANTINE_S.
    The worker binds it a moment later; a race lost to another program shows up as a worker that exits at start,
    which the health path restarts on another port."""
    with _handed_out_lock:
        now = time.monotonic()
        for port, at in list(_handed_out.items()):
            if now - at > PORT_QUARANTINE_S:
                del _handed_out[port]
        while True:
            with socket.socket() as s:
                s.bind((host, 0))
                port = s.getsockname()[1]
            if port not in _handed_out:
                _handed_out[port] = now
                return port


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM me when my parent dies (Linux prctl PR_SET_PDEATHSIG)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(argv: list[str], *, log_path: Path, marker: str | None, env: dict[str, str] | None = None,
          cwd: Path | None = None, die_with_parent: bool = False) -> ProcessHandle:
    """Start `argv` in a new session with stdout and stderr appended to log_path.

    die_with_parent: for `make run`'s own children (web, Celery, agent), which must not outlive a supervisor that
    was killed; never for inference workers, whose whole point is to outlive their agent."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONUNBUFFERED"] = "1"
    if marker is not None:
        child_env[MARKER_ENV] = marker
    command = " ".join(redact(argv)).replace("\n", "\\n")  # one line, which log_tail looks for
    with open(log_path, "ab") as log_file:
        log_file.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {command}\n".encode())
        log_file.flush()
        log_offset = log_file.tell()
        popen = subprocess.Popen(
            argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=child_env,
            cwd=cwd, start_new_session=True, close_fds=True,
            preexec_fn=_die_with_parent if die_with_parent and sys.platform == "linux" else None,
        )
    # Nothing reaps it before it is registered below, so the pid is still this child's: the create time read now is
    # its own, even if it has exited already.
    try:
        proc = psutil.Process(popen.pid)
        create_time = proc.create_time()
    except psutil.NoSuchProcess:
        proc, create_time = None, 0.0
    with _children_lock:
        _children[popen.pid] = _Child(popen, create_time, marker, log_offset)
    if proc is not None and marker is not None:
        _wait_for_environment(proc)
    return ProcessHandle(pid=popen.pid, create_time=create_time, marker=marker)


def _wait_for_environment(proc: psutil.Process, timeout_s: float = 10.0) -> None:
    """Until the new program's environment is readable. Popen returns once exec has closed the child's
    close-on-exec pipe, which the kernel does before it sets up the new environment: in between, /proc/<pid>/environ
    reads as empty, and the marker check would take our own child for a stranger (seen on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if proc.environ():
                return
        except psutil.AccessDenied:
            return
        except psutil.NoSuchProcess:  # a zombie, or reaped by now: it exited, which its exit code will say
            return
        time.sleep(0.005)


SECRET_FLAGS = ("--token",)


def redact(argv: list[str]) -> list[str]:
    """argv for logs: the value after a secret flag (the gateway's API token) is hidden."""
    return [("***" if i and argv[i - 1] in SECRET_FLAGS else arg) for i, arg in enumerate(argv)]


def python_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def reap() -> dict[int, int]:
    """Reap the exited children of this process; returns {pid: exit code} of those reaped now. Their exit codes stay
    known to exit_code()."""
    exited = {}
    with _children_lock:
        for pid, child in list(_children.items()):
            if not child.reaped and child.popen.poll() is not None:
                child.reaped = True
                exited[pid] = child.popen.returncode
        reaped = [pid for pid, child in _children.items() if child.reaped]
        for pid in reaped[:max(0, len(reaped) - NUM_REAPED_KEPT)]:  # dicts keep insertion order: oldest first
            del _children[pid]
    return exited


def _child(pid: int, create_time: float | None = None) -> _Child | None:
    """Our child with that pid (and create time, when given), running or exited, else None."""
    with _children_lock:
        child = _children.get(pid)
    if child is None or (create_time is not None
                         and abs(child.create_time - create_time) > CREATE_TIME_TOLERANCE_S):
        return None
    return child


def exit_code(pid: int, create_time: float | None = None) -> int | None:
    """How a child of ours ended (its exit code; < 0: killed by signal -code), reaping it; None while it runs, or
    when the process with that pid (and create time, when given) is not a child of ours."""
    child = _child(pid, create_time)
    return None if child is None else child.popen.poll()


def is_alive(handle: ProcessHandle) -> bool:
    """Whether handle's process is still the same process and has not exited."""
    if handle.pid <= 0:
        return False
    child = _child(handle.pid, handle.create_time)
    if child is not None:
        if handle.marker is not None and child.marker != handle.marker:
            return False  # our child, but not the worker this handle names
        # Ours: alive until waitpid can reap it, zombie main thread or not. Once poll() has reaped it, its exit
        # status is known, so no one sees it gone before they can learn how it ended. (A poll that finds another
        # thread inside waitpid answers None: alive, for this look.)
        return child.popen.poll() is None
    try:
        proc = psutil.Process(handle.pid)
        off_s = proc.create_time() - handle.create_time
        stepped = abs(off_s) > CREATE_TIME_TOLERANCE_S
        if stepped and (handle.marker is None or abs(off_s) > MAX_CLOCK_STEP_S + CREATE_TIME_TOLERANCE_S
                        or abs(off_s - round(off_s)) > CREATE_TIME_TOLERANCE_S):
            return False  # the pid was recycled
        if proc.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False  # not ours: its parent (init, after an agent restart) reaps it
        if handle.marker is not None:
            try:
                environ = proc.environ()
            except psutil.AccessDenied:
                environ = {}  # another user's process cannot be ours anyway; create_time already matched
            # An empty environment is a process between exec and its set-up (see _wait_for_environment), which
            # create_time already names; a different marker, or none in a set-up environment, is a stranger. After a
            # clock step only the marker itself says it is ours (MAX_CLOCK_STEP_S).
            if (environ or stepped) and environ.get(MARKER_ENV) != handle.marker:
                return False
        return True
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False


def signal_group(handle: ProcessHandle, sig: int) -> bool:
    """Send sig to the handle's process group (its session leader's group); False when it is already gone."""
    if not is_alive(handle):
        return False
    try:
        pgid = os.getpgid(handle.pid)
        if pgid == handle.pid:
            os.killpg(pgid, sig)
        else:
            # Not a group leader (started without a session of its own): never signal someone else's group.
            os.kill(handle.pid, sig)
        return True
    except ProcessLookupError:
        return False


def wait_exit(handle: ProcessHandle, timeout: float, poll_s: float = 0.1) -> bool:
    """Wait until the process is gone; True when it exited within timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if not is_alive(handle):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll_s)


def stop(handle: ProcessHandle, deadline_s: float = 30.0) -> str:
    """SIGTERM the process group, SIGKILL it after deadline_s. Returns "gone" (was not running), "terminated" or
    "killed". Blocks until the process has exited (or 10 s after SIGKILL, which only a D-state process survives);
    then the rest of its group goes too (group_leftovers_kill)."""
    if not signal_group(handle, signal.SIGTERM):
        group_leftovers_kill(handle)
        return "gone"
    if wait_exit(handle, deadline_s):
        group_leftovers_kill(handle)
        return "terminated"
    log.warning("pid %d ignored SIGTERM for %.1f s: SIGKILL", handle.pid, deadline_s)
    signal_group(handle, signal.SIGKILL)
    if not wait_exit(handle, 10.0):
        log.error("pid %d survived SIGKILL for 10 s", handle.pid)
    group_leftovers_kill(handle)
    return "killed"


def group_leftovers_kill(handle: ProcessHandle) -> int:
    """SIGKILL what is left of a stopped or dead process's group: its children (vLLM's engine core and its worker
    processes, ~1.9 GB each) outlive a leader that exits or dies before them, and nothing else would ever stop them.

    The group is the leader's session (spawn starts each process in a new one). Only while the leader is gone, and
    only members started after it: a member whose environment still holds the marker must hold the leader's (vLLM
    renames its processes with setproctitle, which blanks what /proc shows of their environment, so a member
    without the marker counts as the leader's). Returns how many were killed."""
    if handle.marker is None or is_alive(handle):
        return 0
    members = []
    for proc in psutil.process_iter(["pid", "create_time"]):
        try:
            if proc.pid == handle.pid or os.getpgid(proc.pid) != handle.pid:
                continue
            if proc.info["create_time"] < handle.create_time - CREATE_TIME_TOLERANCE_S:
                continue
            try:
                marker = proc.environ().get(MARKER_ENV)
            except psutil.AccessDenied:
                continue
            if marker in (None, handle.marker):
                members.append(proc)
        except (ProcessLookupError, psutil.Error, OSError):
            continue
    if not members:
        return 0
    log.warning("pid %d left %d process(es) of its group behind: SIGKILL %s", handle.pid, len(members),
                ", ".join(str(m.pid) for m in members))
    for member in members:
        try:
            member.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(members, timeout=10)
    return len(members)


_HEADER = re.compile(rb"^--- \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d starting: .*$", re.MULTILINE)
LOG_TAIL_BYTES = 16384


def log_rotate(log_path: str | Path | None, max_bytes: int) -> bool:
    """Past `max_bytes`, the log is copied to `<log>.1` (replacing the previous one) and emptied in place: the
    process holds it open for appending (spawn), so its next line starts the new log, and a flood of lines (a
    client making a worker or gateway log a traceback a thousand times a second) fills at most twice the bound.
    Lines written between the copy and the truncation are lost, as with logrotate's copytruncate."""
    if not log_path:
        return False
    path = Path(log_path)
    try:
        if path.stat().st_size <= max_bytes:
            return False
        shutil.copyfile(path, path.with_name(path.name + ".1"))
        os.truncate(path, 0)
    except OSError:
        return False
    return True


def log_tail(log_path: str | Path | None, num_lines: int = 15, max_chars: int = 2000, *,
             handle: ProcessHandle | None = None) -> str:
    """The last lines of a process log, to explain a death in Worker.last_error.

    handle: only what that process wrote, never its predecessors' lines in the same file: from the offset where its
    output began when it is our child, else (started by an earlier agent) after the last `starting:` line, which
    the newest process of the file wrote, and that is the one its worker row names."""
    if not log_path:
        return ""
    child = _child(handle.pid, handle.create_time) if handle is not None else None
    try:
        with open(log_path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            own_start = child.log_offset if child is not None and child.log_offset <= size else 0
            start = max(own_start, size - LOG_TAIL_BYTES)
            f.seek(start)
            data = f.read()
    except OSError:
        return ""
    if start > own_start:
        data = data.partition(b"\n")[2]  # a partial first line
    if handle is not None and child is None:
        headers = list(_HEADER.finditer(data))
        if headers:
            data = data[headers[-1].end() + 1:]
    text = data.decode(errors="replace")
    return "\n".join(text.splitlines()[-num_lines:])[-max_chars:]
