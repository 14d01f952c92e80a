"""The prefill column's prefix cache chart: one line per worker of the hit rate the scraper stores, its current value
the pool's, and a reason when there is no data (no admission yet, or no prefix caching)."""
from __future__ import annotations

import pytest

from tests.dashboards.test_stage_columns import _page, _stages, _value

pytestmark = pytest.mark.django_db


def test_the_prefix_cache_chart_has_a_line_per_worker_and_the_pool_value(client_for, viewer, deployment,
                                                                          make_worker, seed_samples):
    first, second = make_worker(deployment, "prefill"), make_worker(deployment, "prefill")
    seed_samples(deployment, "prefix_cache_hit_ratio", [0.5, 0.9], role="prefill", worker=first)
    seed_samples(deployment, "prefix_cache_hit_ratio", [0.1, 0.2], role="prefill", worker=second)
    seed_samples(deployment, "prefix_cache_hit_ratio", [0.6], role="prefill")  # the pool's, pooled from counters
    figure = _stages(client_for(viewer))["figures"]["stage-prefill-prefix_cache"]
    assert "Prefix cache hit rate per worker" in figure["layout"]["title"]["text"]
    assert sorted(trace["y"][-1] for trace in figure["data"]) == [20.0, 90.0]  # in %
    assert _value(_page(client_for(viewer)), "prefill:prefix_cache") == "60.0%"


def test_without_samples_the_chart_says_why(client_for, viewer, deployment):
    figure = _stages(client_for(viewer))["figures"]["stage-prefill-prefix_cache"]
    assert "no data yet" in figure["layout"]["annotations"][0]["text"]
    assert "prefix caching" in figure["layout"]["annotations"][0]["text"]
