"""The stage indicators the scraper adds: mean tokens per engine step from the workers' `tandem_batch_tokens_per_step`
histogram (rate of its sum over rate of its count, pooled from summed counters) and the GPU memory fragmentation
gauge. Absent families give absent series ("no data yet"), never zeros."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from controlplane.observability.derive import pool_increments, rate_series, state_append, target_series
from controlplane.observability.exposition import parse_exposition
from inference.metrics import TandemMetrics


class Worker:
    """A worker's registry, with the batch histogram the engine loop observes (labels role, model)."""

    def __init__(self, role="prefill"):
        self.metrics = TandemMetrics(role=role, model="tiny", registry=CollectorRegistry(), gpu=False)
        self.batch = self.metrics.batch_tokens_per_step  # what the engine loop observes after each step
        self.state = None

    def scrape(self, ts: float):
        reading = parse_exposition(self.metrics.render().decode())
        self.state = state_append(self.state, reading, ts, window_s=60)
        return target_series(self.state, reading.gauges)


def test_the_mean_tokens_per_step_is_the_rate_of_the_sum_over_the_rate_of_the_count():
    worker = Worker()
    worker.batch.observe(100)
    worker.scrape(0.0)
    for tokens in (64, 192, 32, 32):  # 4 steps, 320 tokens in the window
        worker.batch.observe(tokens)
    values, _ = worker.scrape(5.0)
    assert values["batch_tokens_per_step"] == pytest.approx(80.0)


def test_a_window_without_steps_or_without_the_histogram_has_no_value():
    idle = Worker()
    idle.batch.observe(10)
    idle.scrape(0.0)
    assert "batch_tokens_per_step" not in idle.scrape(5.0)[0]  # no step in the window: no data, not 0
    # A worker of a version before the histogram: its exposition lacks the family.
    plain = TandemMetrics(role="decode", model="tiny", registry=CollectorRegistry(), gpu=False).render().decode()
    older = "\n".join(line for line in plain.splitlines() if "tandem_batch_tokens_per_step" not in line) + "\n"
    assert "batch_tokens" not in parse_exposition(older).counters


def test_the_pool_mean_weights_each_worker_by_its_steps():
    busy, light = Worker(), Worker()
    for worker in (busy, light):
        worker.batch.observe(1)
        worker.scrape(0.0)
    for _ in range(9):
        busy.batch.observe(100)
    light.batch.observe(10)
    _, busy_inc = busy.scrape(5.0)
    _, light_inc = light.scrape(5.0)
    pooled = rate_series(pool_increments([busy_inc, light_inc]))
    assert pooled["batch_tokens_per_step"] == pytest.approx((900 + 10) / 10)  # not the mean of 100 and 10


def test_the_fast_path_and_the_reference_parser_agree_on_the_new_families():
    worker = Worker("decode")
    for tokens in (3, 5):
        worker.batch.observe(tokens)
    frag = Gauge("tandem_gpu_memory_fragmentation_bytes", "f", ("role", "model", "gpu"),
                 registry=worker.metrics.registry)
    frag.labels("decode", "tiny", "0").set(1 << 30)
    frag.labels("decode", "tiny", "1").set(1 << 20)
    text = generate_latest(worker.metrics.registry).decode()
    fast = parse_exposition(text)
    reference = parse_exposition(text + "# HELP x an escaped \\\\ help line\n")
    assert fast == reference
    assert (fast.counters["batch_tokens"], fast.counters["batch_steps"]) == (8.0, 2.0)
    # GPUs of one worker add up, like the memory they are part of.
    assert fast.gauges["gpu_memory_fragmentation_bytes"] == (1 << 30) + (1 << 20)
