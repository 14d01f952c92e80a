"""GPU series from NVML, as a Prometheus collector.

NVML is initialised once, when the collector is built. Where it does not initialise (no driver, a CPU host) the
collector yields nothing at all: an absent series says "no GPU" more honestly than a zero. A device whose query fails
mid-scrape (a GPU that fell off the bus) loses that series for that scrape; the scrape itself never fails.
"""
from __future__ import annotations

import logging

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

LABELS = ("role", "model", "gpu")


def _nvml():
    """pynvml (from nvidia-ml-py), or None where the package is missing."""
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


class NvmlCollector(Collector):
    """tandem_gpu_* gauges per visible device, labelled role, model and gpu (the NVML index)."""

    def __init__(self, *, role: str, model: str):
        self.role, self.model = role, model
        self.nvml = _nvml()
        self.enabled = False
        if self.nvml is None:
            return
        try:
            self.nvml.nvmlInit()
            self.enabled = True
        except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, ...: a CPU host
            log.info("NVML unavailable, no GPU series: %s", exc)

    def describe(self):
        # An empty describe keeps registration from calling collect() (and NVML) at import time.
        return []

    def collect(self):
        if not self.enabled:
            return
        nvml = self.nvml
        families = {
            "util": GaugeMetricFamily("tandem_gpu_utilization_ratio", "GPU busy fraction over NVML's last sample "
                                      "period (0..1).", labels=LABELS),
            "used": GaugeMetricFamily("tandem_gpu_memory_used_bytes", "GPU memory in use.", labels=LABELS),
            "total": GaugeMetricFamily("tandem_gpu_memory_total_bytes", "GPU memory installed.", labels=LABELS),
            "temp": GaugeMetricFamily("tandem_gpu_temperature_celsius", "GPU core temperature.", labels=LABELS),
            "power": GaugeMetricFamily("tandem_gpu_power_watts", "GPU board power draw.", labels=LABELS),
        }
        try:
            num_devices = nvml.nvmlDeviceGetCount()
        except Exception as exc:
            log.warning("NVML device count failed: %s", exc)
            return
        for index in range(num_devices):
            labels = [self.role, self.model, str(index)]
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
            except Exception as exc:
                log.warning("NVML handle for GPU %d failed: %s", index, exc)
                continue
            # Each query on its own: a device without power readings still reports its memory.
            queries = {
                "util": lambda: nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                "used": lambda: float(nvml.nvmlDeviceGetMemoryInfo(handle).used),
                "total": lambda: float(nvml.nvmlDeviceGetMemoryInfo(handle).total),
                "temp": lambda: float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)),
                "power": lambda: nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,  # NVML reports milliwatts
            }
            for key, query in queries.items():
                try:
                    families[key].add_metric(labels, query())
                except Exception as exc:
                    log.debug("NVML %s for GPU %d failed: %s", key, index, exc)
        yield from families.values()


class TorchMemoryCollector(Collector):
    """tandem_gpu_memory_fragmentation_bytes of the CUDA devices a worker computes on: memory torch's caching
    allocator holds but no tensor uses (`memory_reserved - memory_allocated`). NVML sees the reserved memory as
    used; this says how much of it is the allocator's slack, which a long-running decode worker grows as KV and
    activation tensors of changing shapes come and go.

    Labelled like the NVML series: `gpu` is the physical index where CUDA_VISIBLE_DEVICES names one (the node agent
    gives each worker its GPU that way, visible as cuda:0), else torch's index. Nothing on a CPU device.
    """

    def __init__(self, *, role: str, model: str, devices: list[str], visible_devices: str | None = None):
        self.role, self.model = role, model
        self.indexes: list[int] = []
        for device in devices:
            kind, _, index = device.partition(":")
            if kind == "cuda":
                self.indexes.append(int(index) if index else 0)
        visible = [part.strip() for part in (visible_devices or "").split(",") if part.strip()]
        self.physical = visible if visible and all(part.isdigit() for part in visible) else None

    def describe(self):
        return []

    def _label(self, index: int) -> str:
        if self.physical is not None and index < len(self.physical):
            return self.physical[index]
        return str(index)

    def collect(self):
        if not self.indexes:
            return
        import torch  # only on a worker that computes on CUDA, where torch is loaded already

        family = GaugeMetricFamily(
            "tandem_gpu_memory_fragmentation_bytes",
            "GPU memory reserved by torch's caching allocator but not allocated to a tensor.", labels=LABELS)
        for index in self.indexes:
            try:
                slack = torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index)
            except Exception as exc:  # a device that fell off the bus loses its series, not the scrape
                log.debug("torch memory of GPU %d failed: %s", index, exc)
                continue
            family.add_metric([self.role, self.model, self._label(index)], float(max(slack, 0)))
        yield family
