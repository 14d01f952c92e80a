"""GPU discovery: NVML's devices when it initialises (mocked: this machine has no GPU), else a CPU node."""
from __future__ import annotations

import sys
import types

from controlplane.agent.gpus import discover_gpus


class _Memory:
    total = 80 * 1024**3


def _fake_pynvml(*, fails_init: bool):
    fake = types.ModuleType("pynvml")

    def nvml_init():
        if fails_init:
            raise RuntimeError("NVML Shared Library Not Found")

    fake.nvmlInit = nvml_init
    fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: 2
    fake.nvmlDeviceGetHandleByIndex = lambda index: index
    fake.nvmlDeviceGetName = lambda handle: b"NVIDIA H100 80GB HBM3" if handle == 0 else "NVIDIA H100 80GB HBM3"
    fake.nvmlDeviceGetMemoryInfo = lambda handle: _Memory()
    return fake


def test_it_lists_every_device_nvml_reports(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fails_init=False))
    assert discover_gpus() == [
        {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * 1024**3},
        {"index": 1, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * 1024**3},
    ]


def test_it_registers_a_cpu_host_when_nvml_does_not_initialise(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fails_init=True))
    assert discover_gpus() == []
