"""The scraper's roofline series: each worker's tandem_<stage>_roofline_ratio gauge stored as is, the pool's the mean
of the workers that report one; a worker without host figures exports none, which is no data (never a 0)."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from controlplane.observability.derive import state_append, target_series
from controlplane.observability.exposition import parse_exposition
from controlplane.observability.store import _pool_values
from inference.metrics import TandemMetrics


def _series(reading):
    return target_series(state_append(None, reading, 0.0, window_s=60), reading.gauges)


def _worker(**ratios) -> TandemMetrics:
    metrics = TandemMetrics(role="colocated", model="tiny", registry=CollectorRegistry(), gpu=False, process=False)
    for stage, value in ratios.items():
        metrics.set_roofline(stage, value)
    return metrics


def test_each_workers_stage_ratios_are_stored_and_the_pool_takes_their_mean():
    one, _ = _series(parse_exposition(_worker(prefill=0.5, decode=0.1).render().decode()))
    two, _ = _series(parse_exposition(_worker(prefill=0.3).render().decode()))
    assert (one["prefill_roofline_ratio"], one["decode_roofline_ratio"]) == (0.5, 0.1)
    assert "decode_roofline_ratio" not in two
    pool = _pool_values([(one, None), (two, None)])
    assert pool["prefill_roofline_ratio"] == pytest.approx(0.4)
    assert pool["decode_roofline_ratio"] == pytest.approx(0.1)  # the one worker that reports it


def test_a_worker_without_figures_exports_no_roofline_series():
    text = _worker(prefill=None).render().decode()
    assert "tandem_prefill_roofline_ratio{" not in text
    values, _ = _series(parse_exposition(text))
    assert "prefill_roofline_ratio" not in values and "decode_roofline_ratio" not in values
