"""The deployment page draws a chart only once it is on screen (dashboard.js): a test that reads what plotly drew
scrolls the chart into view first. Each chart's div carries data-points (points in its newest figure, drawn or not)
and data-draws (how often plotly drew it)."""
from __future__ import annotations


def draws(page, key: str) -> int:
    return int(page.get_attribute(f"#chart-{key}", "data-draws") or 0)


def drawn_chart(page, key: str, *, timeout: float = 30_000) -> None:
    """Scroll chart `key` into view and wait until plotly has drawn it."""
    page.wait_for_selector(f"#chart-{key}", state="attached", timeout=timeout)
    page.eval_on_selector(f"#chart-{key}", "div => div.scrollIntoView({block: 'center'})")
    page.wait_for_function(f"() => Number(document.getElementById('chart-{key}').dataset.draws) > 0",
                           timeout=timeout)
