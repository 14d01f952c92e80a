"""The deployment page in Chromium: the prefill and decode columns stand side by side, each drawing its own
indicators (with points where there are samples, the reason where there are none) and its current values."""
from __future__ import annotations

import pytest

from tests.browser.charts import drawn_chart

pytestmark = pytest.mark.browser


def _points(page, key: str) -> str:
    return f"() => Number((document.getElementById('chart-{key}') || {{dataset: {{}}}}).dataset.points) > 0"


def test_the_stage_columns_show_side_by_side_with_their_charts(page, live_server, login, viewer, operator, fleet,
                                                               seed_samples, screenshot):
    from controlplane.services import deployment_objectives_set

    deployment = fleet["deployment"]
    deployment_objectives_set(deployment=deployment, objectives={"ttft_p99_seconds": 0.4}, actor=operator)
    wave = [0.5 + 0.4 * ((i % 24) / 24) for i in range(60)]
    seed_samples(deployment, "ttft_p99_seconds", [0.3 * w for w in wave], role="prefill")
    seed_samples(deployment, "ttft_p50_seconds", [0.1 * w for w in wave], role="prefill")
    seed_samples(deployment, "itl_p99_seconds", [0.08 * w for w in wave], role="decode")
    seed_samples(deployment, "kv_cache_usage_ratio", [0.4 * w for w in wave], role="decode")
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    for key in ("stage-prefill-ttft", "stage-prefill-prompt_tokens", "stage-prefill-queue", "stage-prefill-compute",
                "stage-decode-itl", "stage-decode-gen_tokens", "stage-decode-running", "stage-decode-kv",
                "stage-decode-memory"):
        page.wait_for_function(_points(page, key))
    # Two columns, prefill left of decode, at the same height.
    prefill, decode = page.locator("#stage-prefill").bounding_box(), page.locator("#stage-decode").bounding_box()
    assert prefill["x"] + prefill["width"] <= decode["x"] + 1
    assert abs(prefill["y"] - decode["y"]) < 2
    # prefill: TTFT, prompt tokens, queue, batch, prefix cache, compute, roofline; decode: ITL, generated tokens,
    # running, KV, speculative acceptance, memory, roofline.
    assert page.locator("#stage-charts-prefill .chart").count() == 7
    assert page.locator("#stage-charts-decode .chart").count() == 7
    assert page.locator("#chart-stage-prefill-prefill_roofline").count() == 1
    assert page.locator("#chart-stage-decode-decode_roofline").count() == 1
    # Each column draws its own pool: TTFT of the prefill pool and its objective line, not the gateway's TTFT.
    drawn_chart(page, "stage-prefill-ttft")
    names = page.evaluate("() => document.getElementById('chart-stage-prefill-ttft').data.map(t => t.name)")
    assert sorted(names) == ["P50 prefill", "P99 prefill", "objective P99"]
    # No batch histogram from these workers yet: the chart says so instead of drawing a zero.
    drawn_chart(page, "stage-prefill-batch")
    assert "no data yet" in page.inner_text("#chart-stage-prefill-batch")
    assert page.get_attribute("#chart-stage-prefill-batch", "data-points") == "0"
    # CPU host: the page says these are CPU figures, and the GPU health charts say why they are empty.
    assert page.is_visible("#stages-cpu")
    drawn_chart(page, "health-gpu_temp")
    assert "no GPU on this host" in page.inner_text("#chart-health-gpu_temp")
    assert page.inner_text("[data-stage-value='decode:kv']").endswith("%")
    screenshot(page, "deployment-stages")
    assert page.js_errors == []
