"""Chaos windows as plotly draws them in Chromium: a fault's window is a band behind the deployment page's chart
lines, with its run and fault written at its top (the figure's shapes, dashboards.charts.shade_windows)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from tests.browser.charts import drawn_chart

pytestmark = pytest.mark.browser

BANDS = "div => div.querySelectorAll('.layer-below .shapelayer path').length"
NOTES = "div => Array.from(div.querySelectorAll('.annotation-text')).map(t => t.textContent)"
TICKS = "div => Array.from(div.querySelectorAll('.xtick text')).map(t => t.textContent)"


def test_the_deployment_pages_charts_shade_a_chaos_fault(page, live_server, login, viewer, fleet):
    from controlplane.agent.fault_holds import FAULT_KIND
    from controlplane.models import Action, ActionStatus, ActorType

    now = datetime.now(tz=timezone.utc)
    for kind, event, ago in ((FAULT_KIND, "injected", 90), (FAULT_KIND, "reverted", 30)):
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


def test_a_chaos_runs_report_page_draws_a_chart_per_check_with_its_fault_shaded(page, live_server, login, viewer,
                                                                               fleet, screenshot):
    from controlplane.agent.fault_holds import FAULT_KIND
    from controlplane.chaos.models import ChaosRun, RunStatus
    from controlplane.chaos.report import run_report
    from controlplane.models import Action, ActionStatus, ActorType

    now = datetime.now(tz=timezone.utc)
    hypothesis = [{"metric": "error_ratio", "role": "gateway", "max": 0.05, "window_s": 5},
                  {"metric": "ready_workers", "role": "decode", "min": 1}]
    run = ChaosRun.objects.create(
        deployment=fleet["deployment"], status=RunStatus.FINISHED, verdict="passed",
        spec={"name": "pause-decode", "hypothesis": hypothesis, "recovery_timeout_s": 60},
        baseline={"at": (now - timedelta(seconds=100)).timestamp(), "values": [0.0, 1.0]},
        timeline=[{"t": (now - timedelta(seconds=s)).timestamp(), "phase": phase, "holds": True, "values": [e, r],
                   "failing": []} for s, phase, e, r in ((80, "during", 0.02, 0.0), (50, "during", 0.03, 0.0),
                                                         (20, "after", 0.0, 1.0))],
        started_at=now - timedelta(seconds=95), fault_ends_at=now - timedelta(seconds=35),
        reverted_at=now - timedelta(seconds=30), recovered_at=now - timedelta(seconds=20),
        finished_at=now - timedelta(seconds=15))
    for kind, event, ago in ((FAULT_KIND, "injected", 90), (FAULT_KIND, "reverted", 30)):
        Action.objects.create(kind=kind, deployment=fleet["deployment"], actor_type=ActorType.SYSTEM,
                              actor="node agent n", status=ActionStatus.SUCCEEDED,
                              idempotency_key=f"chaos-{run.pk}-0-w1:{event}",
                              created_at=now - timedelta(seconds=ago),
                              params={"chaos_run": run.pk, "fault": "pause", "event": f"fault_{event}"})
    run.report = run_report(run)
    run.save(update_fields=["report"])
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/chaos/runs/{run.pk}")
    for key in ("check-0", "check-1"):
        page.wait_for_selector(f"[data-chart='{key}'] .main-svg", state="attached")
        assert page.eval_on_selector(f"[data-chart='{key}']", BANDS) == 1
        assert f"chaos run {run.pk}: pause" in page.eval_on_selector(f"[data-chart='{key}']", NOTES)
        # A run of a minute and a half: ticks seconds apart carry the seconds, never the same minute twice.
        ticks = page.eval_on_selector(f"[data-chart='{key}']", TICKS)
        assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), ticks
    screenshot(page, "chaos-run-report")
    assert page.js_errors == []
