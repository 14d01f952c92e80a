"""The fleet bench's CPU sets and CPU accounting (bench/lib/fleet_cpu.py): the CPUs split in two sides, a child pinned
at exec keeps its side's set, and its CPU seconds are read from /proc while it runs."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.lib.fleet_cpu import CpuWindow, cpu_sets, pinned, proc_cpu_seconds

BURN = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\ntime.sleep(30)"


def test_the_cpus_split_in_two_sides_and_one_cpu_is_no_split():
    assert cpu_sets({0, 1}) == ({0}, {1})
    assert cpu_sets({0, 1, 2, 3, 4}) == ({0, 1, 2}, {3, 4})
    assert cpu_sets({3}) is None


def test_a_process_that_is_not_there_has_no_cpu_seconds():
    assert proc_cpu_seconds(2**22 + 7) is None  # above the kernel's largest pid (pid_max)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to one of them")
def test_a_pinned_child_runs_on_its_set_and_its_cpu_seconds_are_counted():
    cpu = max(os.sched_getaffinity(0))
    child = subprocess.Popen(pinned([sys.executable, "-c", BURN], {cpu}))
    try:
        window = CpuWindow(lambda: {"burner": [child.pid]}, refresh_s=0.0)
        window.sample()
        deadline = time.monotonic() + 30
        while (proc_cpu_seconds(child.pid) or 0.0) < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        window.sample()
        report = window.report(interval_s=5.0)["burner"]
        assert os.sched_getaffinity(child.pid) == {cpu} and report["cpus"] == [cpu]
        assert report["num_processes"] == 1 and report["cpu_s"] > 0
    finally:
        child.kill()
        child.wait()
