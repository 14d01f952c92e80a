"""tandem_gpu_memory_fragmentation_bytes: torch's reserved minus allocated memory per CUDA device a worker computes
on, labelled with the physical GPU index; absent on a CPU worker. torch.cuda is mocked (this host has no GPU)."""
from __future__ import annotations

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from inference.metrics import TandemMetrics

NAME = "tandem_gpu_memory_fragmentation_bytes"


def fragmentation(metrics: TandemMetrics) -> dict[str, float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == NAME:
                assert (s.labels["role"], s.labels["model"]) == (metrics.role, metrics.model)
                out[s.labels["gpu"]] = s.value
    return out


@pytest.fixture
def fake_cuda(monkeypatch):
    """Device 0: 6 GiB reserved, 5 GiB allocated; device 1: 2 GiB reserved, all allocated."""
    reserved = {0: 6 << 30, 1: 2 << 30}
    allocated = {0: 5 << 30, 1: 2 << 30}
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda index: reserved[index])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda index: allocated[index])
    return reserved, allocated


def test_a_cuda_worker_exports_reserved_minus_allocated_per_device(fake_cuda):
    metrics = TandemMetrics(role="decode", model="tiny", gpu=False)
    metrics.watch_devices(["cuda:0", "cuda:1"])
    assert fragmentation(metrics) == {"0": float(1 << 30), "1": 0.0}


def test_the_series_follows_the_allocator_between_scrapes(fake_cuda):
    reserved, allocated = fake_cuda
    metrics = TandemMetrics(role="prefill", model="tiny", gpu=False)
    metrics.watch_devices(["cuda"])
    assert fragmentation(metrics) == {"0": float(1 << 30)}
    allocated[0] = 3 << 30  # tensors freed, the cache keeps the blocks
    assert fragmentation(metrics) == {"0": float(3 << 30)}


def test_the_gpu_label_is_the_physical_index_the_agent_made_visible(fake_cuda):
    # The node agent starts a worker with CUDA_VISIBLE_DEVICES=3: it computes on cuda:0, which is GPU 3 for NVML.
    metrics = TandemMetrics(role="decode", model="tiny", gpu=False)
    metrics.watch_devices(["cuda:0"], visible_devices="3")
    assert fragmentation(metrics) == {"3": float(1 << 30)}


def test_a_device_whose_query_fails_loses_its_series_not_the_scrape(fake_cuda, monkeypatch):
    def reserved(index):
        if index == 1:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return 6 << 30

    monkeypatch.setattr(torch.cuda, "memory_reserved", reserved)
    metrics = TandemMetrics(role="decode", model="tiny", gpu=False)
    metrics.watch_devices(["cuda:0", "cuda:1"])
    assert fragmentation(metrics) == {"0": float(1 << 30)}
    assert b"tandem_requests_running" in metrics.render()


def test_a_cpu_worker_has_no_fragmentation_series(monkeypatch):
    def no_cuda(index):
        raise AssertionError("a CPU worker must not ask torch.cuda")

    monkeypatch.setattr(torch.cuda, "memory_reserved", no_cuda)
    metrics = TandemMetrics(role="colocated", model="tiny", gpu=False)
    metrics.watch_devices(["cpu"])
    assert fragmentation(metrics) == {}
    assert NAME.encode() not in metrics.render()
