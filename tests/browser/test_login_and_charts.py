"""Log in, the overview, a deployment page whose charts render with data points and refresh live."""
from __future__ import annotations

import pytest

from tests.browser.charts import drawn_chart

pytestmark = pytest.mark.browser


def test_an_operator_logs_in_and_the_deployment_charts_render_their_points(page, live_server, login, operator,
                                                                           fleet, screenshot):
    login(page, operator)
    assert "demo" in page.inner_text("#deployments")
    screenshot(page, "overview")

    page.click("text=demo")
    page.wait_for_url(f"{live_server.url}/deployments/demo/")
    # The first chart data arrives through fetch and is drawn by Plotly.react into an SVG line.
    page.wait_for_function("() => Number((document.getElementById('chart-ttft') || {dataset: {}}).dataset.points) > 0")
    assert int(page.get_attribute("#chart-ttft", "data-points")) > 10
    # Charts below the fold are drawn once scrolled to.
    drawn_chart(page, "ttft")
    assert page.locator("#chart-ttft .scatterlayer .trace path.js-line").count() >= 2  # P50 and P99
    drawn_chart(page, "kv")
    assert page.locator("#chart-kv .scatterlayer .trace").count() == 2  # one line per worker
    assert page.is_visible("#no-gpu")  # this host has no GPU: CPU and memory charts instead
    drawn_chart(page, "cpu")
    assert page.locator("#chart-cpu .scatterlayer .trace").count() == 2
    screenshot(page, "deployment")

    page.click(".segmented a[data-range='15m']")
    page.wait_for_function("() => location.search === '?range=15m'")
    assert page.js_errors == []


def test_the_page_refreshes_itself_without_reloading(page, live_server, login, viewer, fleet):
    from controlplane.models import Worker

    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    page.evaluate("() => { window.__not_reloaded = true; }")
    page.wait_for_function("() => Number((document.getElementById('chart-ttft') || {dataset: {}}).dataset.points) > 0")
    decode = fleet["workers"][1]
    Worker.objects.filter(pk=decode.pk).update(last_error="CUDA error: out of memory (simulated)")
    page.wait_for_selector("text=CUDA error: out of memory (simulated)")
    assert page.evaluate("() => window.__not_reloaded") is True
    page.wait_for_function("() => document.getElementById('refresh-state').innerText.includes('live: updated')")
