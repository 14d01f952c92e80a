"""Real processes for tests: start, wait until healthy, stop. Every wait has a deadline."""
from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests

from controlplane.agent import processes

ROOT = Path(__file__).resolve().parent.parent

# The exit syscall's number (x86_64, aarch64; None elsewhere): one thread leaves, the process goes on.
SYS_EXIT = {"x86_64": 60, "aarch64": 93}.get(platform.machine())
# A child whose main thread ends while another thread runs on: the process lives, its leader shows as a zombie, and
# waitpid cannot reap it yet (as a SIGKILLed process with many threads looks for a moment).
MAIN_THREAD_GONE = [sys.executable, "-c",
                    "import ctypes, threading, time\n"
                    "threading.Thread(target=time.sleep, args=(600,)).start()\n"
                    "print('leaving the main thread', flush=True)\n"
                    f"ctypes.CDLL(None).syscall({SYS_EXIT}, 0)"]


def free_port() -> int:
    """The agent's own: a port nothing listens on now, and not one handed out lately (the kernel picks bind(0)'s port
    at random, so calls in a row repeat one now and then, and two servers told the same port collide later)."""
    return processes.free_port()


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log_path: Path
    url: str | None = None
    extra: dict = field(default_factory=dict)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode

    def kill9(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(5)


def start(name: str, args: list[str], log_dir: Path, env: dict | None = None, cwd: Path = ROOT) -> Proc:
    """Start `python <args>` with its output in log_dir/name.log."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONUNBUFFERED"] = "1"
    if env:
        full_env.update(env)
    log = open(log_path, "wb")
    popen = subprocess.Popen([sys.executable, *args], stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=cwd)
    log.close()
    return Proc(name=name, popen=popen, log_path=log_path)


def wait_http(proc: Proc, url: str, timeout: float = 90.0, status: int = 200) -> None:
    """Wait until GET url answers `status`; fail with the process log if it dies or the deadline passes."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if not proc.alive():
            raise AssertionError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log()}")
        try:
            r = requests.get(url, timeout=2)
            if r.status_code == status:
                return
            last = f"HTTP {r.status_code}"
        except requests.RequestException as exc:
            last = repr(exc)
        time.sleep(0.2)
    raise AssertionError(f"{proc.name}: {url} not {status} after {timeout}s (last: {last}):\n{proc.log()}")


def start_fault_proxy(name: str, upstream_url: str, log_dir: Path, *flags: str, until: float | None = None,
                      wait: bool = True) -> Proc:
    """The chaos fault proxy (controlplane/agent/fault_proxy.py, as a node agent starts it) in front of
    `upstream_url`, its faults active until `until` (default: an hour from now); `.url` is the proxy's. With
    wait=False it returns before the proxy answers (wait_http(proc, proc.url + "/health") then), so that several
    start together."""
    port = free_port()
    until = time.time() + 3600 if until is None else until
    proc = start(name, ["-m", "controlplane.agent.fault_proxy", "--upstream", upstream_url, "--port", str(port),
                        "--until", f"{until:.3f}", "--drain-s", "0", *flags], log_dir)
    proc.url = f"http://127.0.0.1:{port}"
    if wait:
        wait_http(proc, proc.url + "/health", timeout=30)
    return proc
