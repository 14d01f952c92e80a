"""The deployment page in a browser: stopped workers are hidden until the toggle shows them, and stay shown across
the page's 5-second refresh and a change of time range; a worker's line keeps its colour when other workers come
and go."""
from __future__ import annotations

import pytest

from tests.browser.charts import drawn_chart

pytestmark = pytest.mark.browser

TRACE_COLOURS = """() => Object.fromEntries((document.getElementById('chart-kv').data || [])
    .map(trace => [trace.name, trace.line.color]))"""


def _refreshed(page) -> None:
    """Wait for the next 5-second refresh of the charts and the live fragment to finish."""
    page.evaluate("() => { document.getElementById('refresh-state').textContent = 'waiting'; }")
    page.wait_for_function("() => document.getElementById('refresh-state').textContent.startsWith('live: updated')",
                           timeout=30_000)


def test_stopped_workers_show_only_on_request_and_stay_shown_across_refreshes(page, live_server, login, viewer,
                                                                             fleet, make_worker, screenshot):
    from django.utils import timezone

    stopped = make_worker(fleet["deployment"], "decode", status="stopped", stopped_at=timezone.now())
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    assert page.locator(f"#workers tr[data-worker='{stopped.pk}']").count() == 0
    page.click(".segmented a[data-range='1h']")
    page.wait_for_function("() => location.search === '?range=1h'")

    page.click("#toggle-stopped")
    # A page load on a host running three suites at once took more than Playwright's default 30 s (CI, 2026-12-03)
    page.wait_for_url("**/deployments/demo/?stopped=1&range=1h", timeout=90_000)
    assert page.is_visible(f"#workers tr[data-worker='{stopped.pk}']")
    _refreshed(page)
    assert page.is_visible(f"#workers tr[data-worker='{stopped.pk}']")
    assert page.locator(".segmented a.active").inner_text() == "1h"
    screenshot(page, "deployment-stopped-workers-shown")

    page.click("#toggle-stopped")  # hide them again
    page.wait_for_function("() => !new URLSearchParams(location.search).has('stopped')")
    assert page.locator(f"#workers tr[data-worker='{stopped.pk}']").count() == 0
    assert page.js_errors == []


def test_a_worker_keeps_its_colour_when_another_worker_appears(page, live_server, login, viewer, fleet,
                                                               make_worker, seed_samples):
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    drawn_chart(page, "kv")
    before = page.evaluate(TRACE_COLOURS)
    assert len(before) == 2 and len(set(before.values())) == 2

    # A second decode worker appears; by name it sorts between the two that were there.
    newcomer = make_worker(fleet["deployment"], "decode")
    seed_samples(fleet["deployment"], "kv_cache_usage_ratio", [0.2, 0.3], role="decode", worker=newcomer)
    page.wait_for_function(f"() => ({TRACE_COLOURS})()['decode #{newcomer.pk}'] !== undefined", timeout=30_000)
    after = page.evaluate(TRACE_COLOURS)
    assert {name: after[name] for name in before} == before
    assert page.js_errors == []
