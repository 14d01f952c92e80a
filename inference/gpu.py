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
