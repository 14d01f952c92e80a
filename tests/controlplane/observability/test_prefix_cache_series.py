"""The scraper's prefix cache series from the workers' counters: the hit rate over the window (rate of hit tokens
over rate of queried tokens, pooled from summed counters, absent when nothing was admitted) and the tokens saved
per second."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from controlplane.observability.derive import pool_increments, rate_series, state_append, target_series
from controlplane.observability.exposition import parse_exposition
from inference.metrics import TandemMetrics


class Worker:
    def __init__(self):
        self.metrics = TandemMetrics(role="prefill", model="tiny", registry=CollectorRegistry(), gpu=False)
        self.queried = self.hit = 0
        self.state = None

    def admit(self, queried: int, hit: int) -> None:
        """What the engine loop publishes after a step (the engine's counts since start)."""
        self.queried, self.hit = self.queried + queried, self.hit + hit
        self.metrics.set_engine_stats({"prefix_cache_queried_tokens": self.queried,
                                       "prefix_cache_hit_tokens": self.hit, "prefix_cache_blocks": 3})

    def scrape(self, ts: float):
        reading = parse_exposition(self.metrics.render().decode())
        self.state = state_append(self.state, reading, ts, window_s=60)
        return target_series(self.state, reading.gauges)


def test_the_hit_rate_is_over_the_window_and_the_saved_tokens_are_a_rate():
    worker = Worker()
    worker.admit(1000, 0)  # before the window: a cold start
    worker.scrape(0.0)
    worker.admit(1000, 900)
    worker.admit(1000, 700)
    values, _ = worker.scrape(10.0)
    assert values["prefix_cache_hit_ratio"] == pytest.approx(0.8)
    assert values["prefix_cache_hit_tokens_per_second"] == pytest.approx(160.0)


def test_no_admission_in_the_window_is_no_hit_rate():
    worker = Worker()
    worker.admit(100, 50)
    worker.scrape(0.0)
    values, _ = worker.scrape(5.0)
    assert "prefix_cache_hit_ratio" not in values
    assert values["prefix_cache_hit_tokens_per_second"] == 0.0


def test_the_pool_hit_rate_weights_each_worker_by_its_tokens():
    busy, light = Worker(), Worker()
    for worker in (busy, light):
        worker.admit(1, 0)
        worker.scrape(0.0)
    busy.admit(9000, 9000)
    light.admit(1000, 0)
    _, busy_inc = busy.scrape(5.0)
    _, light_inc = light.scrape(5.0)
    assert rate_series(pool_increments([busy_inc, light_inc]))["prefix_cache_hit_ratio"] == pytest.approx(0.9)
