"""Chaos windows as plotly draws them in Chromium: a fault's window is a band behind the deployment page's chart
lines, with its run and fault written at its top (the figure's shapes, dashboards.charts.shade_windows)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.browser.charts import drawn_chart

pytestmark = pytest.mark.browser

BANDS = "div => div.querySelectorAll('.layer-below .shapelayer path').length"
NOTES = "div => Array.from(div.querySelectorAll('.annotation-text')).map(t => t.textContent)"


def test_the_deployment_pages_charts_shade_a_chaos_fault(page, live_server, login, viewer, fleet):
    from controlplane.agent.faults import INJECTED_KIND, REVERTED_KIND
    from controlplane.models import Action, ActionStatus, ActorType

    now = datetime.now(tz=timezone.utc)
    for kind, event, ago in ((INJECTED_KIND, "injected", 90), (REVERTED_KIND, "reverted", 30)):
        Action.objects.create(kind=kind, deployment=fleet["deployment"], actor_type=ActorType.SYSTEM,
                              actor="node agent n", status=ActionStatus.SUCCEEDED,
                              idempotency_key=f"chaos-4-0-w1:{event}", created_at=now - timedelta(seconds=ago),
                              params={"chaos_run": 4, "fault": "latency", "event": f"fault_{event}"})
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    drawn_chart(page, "qps")
    assert page.eval_on_selector("#chart-qps", "div => div.layout.shapes.length") == 1  # in the figure
    assert page.eval_on_selector("#chart-qps", BANDS) == 1  # and drawn
    assert "chaos run 4: latency" in page.eval_on_selector("#chart-qps", NOTES)
    assert page.js_errors == []
