"""The deployment page draws its ~25 charts only as they come into view, and each refresh redraws only those in
view: the time until the page is interactive is measured with the Performance API and printed (a figure, not a timed
assertion: a shared 2-core machine's load decides it); charts below the fold are drawn once scrolled to."""
from __future__ import annotations

import pytest

from tests.browser.charts import draws, drawn_chart

pytestmark = pytest.mark.browser

# Long tasks (> 50 ms on the main thread) from the page's start, observed before any script of the page runs.
LONG_TASKS = """
window.__longTasks = [];
try {
  new PerformanceObserver(list => list.getEntries().forEach(e => window.__longTasks.push([e.startTime,
    e.startTime + e.duration]))).observe({type: "longtask", buffered: true});
} catch (error) { window.__longTasks = null; }
"""
QUIET_MS = 1000
# Interactive: the first refresh has drawn the charts in view, and from then on the main thread has QUIET_MS without
# a long task (Lighthouse's time-to-interactive, with a shorter quiet window: the page refreshes every 5 s).
INTERACTIVE_AT = """quiet => {
  const ready = performance.getEntriesByName("tandem:charts-ready")[0];
  if (!ready || window.__longTasks === null) { return null; }
  let at = ready.startTime;
  for (const [start, end] of window.__longTasks.slice().sort((a, b) => a[0] - b[0])) {
    if (start < at + quiet && end > at) { at = end; }
  }
  return performance.now() >= at + quiet ? at : null;
}"""
TIMING = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const first = performance.getEntriesByName("tandem:first-chart")[0];
  const charts = Array.from(document.querySelectorAll(".chart[data-chart]"));
  return {response_end: nav.responseEnd, dom_interactive: nav.domInteractive, load_end: nav.loadEventEnd,
          first_chart: first ? first.startTime : null,
          charts_ready: performance.getEntriesByName("tandem:charts-ready")[0].startTime,
          num_long_tasks: window.__longTasks.length,
          long_tasks_ms: window.__longTasks.reduce((sum, [start, end]) => sum + end - start, 0),
          num_charts: charts.length, num_drawn: charts.filter(div => Number(div.dataset.draws) > 0).length};
}"""
ON_SCREEN = """() => Array.from(document.querySelectorAll(".chart[data-chart]")).filter(div => {
  const box = div.getBoundingClientRect(); return box.bottom > 0 && box.top < window.innerHeight;
}).map(div => div.dataset.chart)"""


def _refreshed(page) -> None:
    page.evaluate("() => { document.getElementById('refresh-state').textContent = 'waiting'; }")
    page.wait_for_function("() => document.getElementById('refresh-state').textContent.startsWith('live: updated')")


def test_the_page_is_interactive_before_the_charts_below_the_fold_are_drawn(page, live_server, login, viewer, fleet,
                                                                           capsys):
    page.add_init_script(LONG_TASKS)
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    page.wait_for_function("() => performance.getEntriesByName('tandem:charts-ready').length > 0")
    interactive = page.wait_for_function(INTERACTIVE_AT, arg=QUIET_MS).json_value()
    timing = page.evaluate(TIMING)
    with capsys.disabled():
        first = "none on screen" if timing["first_chart"] is None else f"{timing['first_chart']:.0f} ms"
        print(f"\ndeployment page in Chromium (viewport 1400x1000, from navigation start): response "
              f"{timing['response_end']:.0f} ms, DOM interactive {timing['dom_interactive']:.0f} ms, load "
              f"{timing['load_end']:.0f} ms, first chart drawn {first}, first refresh done "
              f"{timing['charts_ready']:.0f} ms, interactive ({QUIET_MS} ms without a long task) {interactive:.0f} ms; "
              f"{timing['num_drawn']} of {timing['num_charts']} charts drawn; {timing['num_long_tasks']} long tasks, "
              f"{timing['long_tasks_ms']:.0f} ms in all")

    # Every chart has its place and its data; those below the fold are not drawn.
    assert timing["num_charts"] >= 20
    assert 0 < timing["num_drawn"] < timing["num_charts"]
    assert int(page.get_attribute("#chart-kv", "data-points")) > 0
    assert draws(page, "kv") == 0 and page.locator("#chart-kv .main-svg").count() == 0
    _refreshed(page)
    assert draws(page, "kv") == 0  # a refresh redraws only what is in view

    drawn_chart(page, "kv")
    assert page.locator("#chart-kv .scatterlayer .trace").count() == 2  # one line per worker
    assert page.js_errors == []


def test_a_refresh_redraws_the_charts_in_view_and_not_those_scrolled_away(page, live_server, login, viewer, fleet):
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    drawn_chart(page, "kv")
    # Back up to the first charts (the cards above them may fill the first screen).
    page.evaluate("() => document.querySelector('.chart[data-chart]').scrollIntoView({block: 'start'})")
    _refreshed(page)  # the refresh that may still hold the kv chart's scroll-in is past
    in_view = page.evaluate(ON_SCREEN)
    assert in_view and "kv" not in in_view
    before = {key: draws(page, key) for key in in_view + ["kv"]}
    _refreshed(page)
    _refreshed(page)
    assert all(draws(page, key) > before[key] for key in in_view)
    assert draws(page, "kv") == before["kv"]
    assert page.js_errors == []
