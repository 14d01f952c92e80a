"""GPU series appear exactly when NVML initialises, with role, model and gpu labels and base units."""
from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference.metrics import TandemMetrics

GPU_NAMES = ("tandem_gpu_utilization_ratio", "tandem_gpu_memory_used_bytes", "tandem_gpu_memory_total_bytes",
             "tandem_gpu_temperature_celsius", "tandem_gpu_power_watts")


def samples(metrics: TandemMetrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def fake_nvml(monkeypatch):
    """Two devices; device 1 has no power reading (like some boards), device 0 reports everything."""
    memory = {0: SimpleNamespace(used=3 << 30, total=80 << 30, free=77 << 30),
              1: SimpleNamespace(used=1 << 30, total=40 << 30, free=39 << 30)}

    def power(handle):
        if handle == 1:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 215_500  # milliwatts

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetUtilizationRates", lambda h: SimpleNamespace(gpu=[87, 5][h], memory=0))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", lambda h: memory[h])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetTemperature", lambda h, sensor: [64, 41][h])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", power)


def test_gpu_series_appear_with_labels_and_base_units_when_nvml_initialises(fake_nvml):
    got = samples(TandemMetrics(role="decode", model="tiny"))
    lab = lambda gpu: (("gpu", gpu), ("model", "tiny"), ("role", "decode"))  # noqa: E731
    assert got[("tandem_gpu_utilization_ratio", lab("0"))] == pytest.approx(0.87)
    assert got[("tandem_gpu_utilization_ratio", lab("1"))] == pytest.approx(0.05)
    assert got[("tandem_gpu_memory_used_bytes", lab("0"))] == 3 << 30
    assert got[("tandem_gpu_memory_total_bytes", lab("1"))] == 40 << 30
    assert got[("tandem_gpu_temperature_celsius", lab("0"))] == 64
    assert got[("tandem_gpu_power_watts", lab("0"))] == pytest.approx(215.5)
    # A query that fails drops that one series, not the device's others nor the scrape.
    assert ("tandem_gpu_power_watts", lab("1")) not in got
    assert ("tandem_gpu_temperature_celsius", lab("1")) in got


def test_gpu_series_are_absent_when_nvml_does_not_initialise(monkeypatch):
    def no_driver():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    got = samples(TandemMetrics(role="prefill", model="tiny"))
    assert not any(name.startswith("tandem_gpu_") for name, _ in got)
    # The process collector's CPU and memory series stand in for them.
    assert any(name == "process_cpu_seconds_total" for name, _ in got)
    assert got[("tandem_requests_running", (("model", "tiny"), ("role", "prefill")))] == 0


def test_every_design_metric_name_is_exposed_with_role_and_model():
    metrics = TandemMetrics(role="colocated", model="tiny", gpu=False)
    metrics.count_success("length")
    metrics.count_error("engine")
    got = samples(metrics)
    names = {name for name, _ in got}
    for name in ("tandem_time_to_first_token_seconds_bucket", "tandem_inter_token_latency_seconds_bucket",
                 "tandem_e2e_request_latency_seconds_bucket", "tandem_kv_transfer_seconds_bucket",
                 "tandem_requests_running", "tandem_requests_waiting", "tandem_kv_cache_usage_ratio",
                 "tandem_prompt_tokens_total", "tandem_generation_tokens_total",
                 "tandem_prefill_tokens_computed_total", "tandem_kv_transfer_bytes_total"):
        assert name in names, name
    labels = dict((("finished_reason", "length"), ("model", "tiny"), ("role", "colocated")))
    assert got[("tandem_request_success_total", tuple(sorted(labels.items())))] == 1
    assert got[("tandem_request_errors_total", (("kind", "engine"), ("model", "tiny"), ("role", "colocated")))] == 1
