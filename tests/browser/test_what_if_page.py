"""The what-if page in Chromium: a viewer follows the deployment page's link, halves the decode pool in the form and
reads the verdict, the figures side by side and the three charts plotly drew (served from this server, under the
page's Content-Security-Policy); a refused change shows the what-if's message on the page."""
from __future__ import annotations

import pytest

from tests.dashboards.what_if_fleet import profile_with_peak_trace
from tests.page_assets import foreign_assets

pytestmark = pytest.mark.browser

CHARTS = ("ttft", "replicas", "traffic")


@pytest.fixture
def fleet(transactional_db, deployment):
    return profile_with_peak_trace(deployment)


def test_a_viewer_replays_halving_the_decode_pool_and_reads_the_charts(page, live_server, login, viewer, fleet,
                                                                       screenshot):
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    page.click("text=What-if")
    page.wait_for_url(f"{live_server.url}/deployments/demo/what-if")
    page.select_option("#what-if-trace", "peak")
    page.fill("input[name=replicas_decode]", "1")
    page.click("[data-testid='run-what-if']")
    page.wait_for_selector("[data-testid='verdict']")
    assert page.inner_text("[data-testid='verdict']") == "below the objective"
    assert page.inner_text("#attainment-before") == "100.00 %"
    assert page.get_attribute("#what-if-figures tr[data-figure='ttft_p99']", "data-figure") == "ttft_p99"
    for key in CHARTS:
        page.wait_for_selector(f".chart[data-chart='{key}'] .main-svg")
        assert int(page.get_attribute(f".chart[data-chart='{key}']", "data-points")) > 0
    assert '"change": {"pools": {"decode": {"replicas": 1}}}' in page.inner_text("#what-if-request")
    assert foreign_assets(page.content()) == []
    screenshot(page, "what-if")

    page.fill("input[name=replicas_decode]", "9")
    page.click("[data-testid='run-what-if']")
    page.wait_for_selector("[data-testid='what-if-error']")
    assert "outside min..max (1..8)" in page.inner_text("[data-testid='what-if-error']")
    assert page.csp_violations == [] and page.js_errors == []
