"""What `make run` holds in RAM: its own processes (web, Celery, beat, the node agent and their children) and the
worker and gateway processes of this node, each counted once.

Two sums: RSS, what `ps` and `top` show per process added up (it counts the pages the processes share, torch's
libraries above all, once per process), and PSS, each shared page split among its sharers: what the demo actually
takes from the machine.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from controlplane.models import Worker, WorkerStatus


@dataclass(frozen=True, slots=True)
class StackMemory:
    rss_bytes: int
    pss_bytes: int
    num_processes: int

    def line(self) -> str:
        return (f"{self.rss_bytes / 2**30:.2f} GiB RSS in all ({self.pss_bytes / 2**30:.2f} GiB counting shared "
                f"pages once) over {self.num_processes} processes")


def stack_memory(*, node_name: str, root_pid: int | None = None) -> StackMemory:
    """The memory of the process tree under root_pid (default: this process) and of this node's live workers."""
    root = psutil.Process(root_pid or os.getpid())
    processes = {root.pid: root, **{child.pid: child for child in root.children(recursive=True)}}
    pids = Worker.objects.filter(node__name=node_name, pid__isnull=False).exclude(
        status__in=(WorkerStatus.STOPPED, WorkerStatus.FAILED)).values_list("pid", flat=True)
    for pid in pids:
        if pid not in processes:
            try:
                processes[pid] = psutil.Process(pid)
            except psutil.Error:
                continue  # exited since the row was read
    rss = pss = num = 0
    for process in processes.values():
        try:
            info = process.memory_full_info()
        except psutil.Error:
            continue
        rss, pss, num = rss + info.rss, pss + getattr(info, "pss", info.rss), num + 1
    return StackMemory(rss_bytes=rss, pss_bytes=pss, num_processes=num)
