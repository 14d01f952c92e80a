"""A resource hog with its own deadline, the fallback of the resource faults when `stress-ng` is not installed
(controlplane.agent.resource_faults):

    python controlplane/agent/hog.py --until 1767225600 --cpu 2           # 2 busy processes
    python controlplane/agent/hog.py --until 1767225600 --memory-mib 512  # 512 MiB allocated and touched

It exits at `--until` (Unix seconds) by itself, whoever is still around to stop it, and on SIGTERM at once; the
agent also runs it under `timeout`, so even a hog that hangs dies at its deadline. Standard library only, and run
as a file rather than with `-m` (the `controlplane` package would import Django and Celery): it starts in
milliseconds.
"""
from __future__ import annotations

import argparse
import mmap
import os
import signal
import sys
import time

PAGE = mmap.PAGESIZE


def _busy(until: float) -> None:
    """Spin until the deadline, looking at the clock every few thousand iterations."""
    counter = 0
    while time.time() < until:
        for _ in range(20_000):
            counter += 1


def cpu_hog(count: int, until: float) -> None:
    children = []
    for _ in range(count - 1):
        pid = os.fork()
        if pid == 0:
            _busy(until)
            os._exit(0)
        children.append(pid)
    _busy(until)
    for pid in children:
        os.waitpid(pid, 0)


def memory_hog(mib: int, until: float) -> None:
    """Allocate and touch `mib` MiB (anonymous memory, every page written, so it is resident), then hold it."""
    size = mib * 1024 * 1024
    block = mmap.mmap(-1, size)
    for offset in range(0, size, PAGE):
        block[offset] = 1
    print(f"holding {mib} MiB until {until:.3f}", flush=True)
    while time.time() < until:
        time.sleep(min(0.5, max(0.0, until - time.time())))
    block.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hog.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--until", type=float, required=True, help="exit at this time (Unix seconds)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--cpu", type=int, help="this many busy processes")
    what.add_argument("--memory-mib", type=int, help="allocate and touch this many MiB")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    if args.cpu is not None:
        if args.cpu < 1:
            parser.error("--cpu must be at least 1")
        cpu_hog(args.cpu, args.until)
    else:
        if args.memory_mib < 1:
            parser.error("--memory-mib must be at least 1")
        memory_hog(args.memory_mib, args.until)
    return 0


if __name__ == "__main__":
    sys.exit(main())
