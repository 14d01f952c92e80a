"""A chaos run's report page: the verdict, the hypothesis before / during / after with a chart per check (the
values the run judged, the limit, the fault window shaded as on the deployment page), the recovery time, the
gateway's request counts, each fault with the agent's Action rows, and every action written meanwhile, linked; a
run in progress shows its live report and reloads; viewers read it, the card links it."""
from __future__ import annotations

import json
import re
import time

import pytest
from django.test import Client

from controlplane.chaos.driver import drive_run
from controlplane.chaos.models import ChaosRun, RunStatus, Verdict
from controlplane.chaos.services import run_start
from controlplane.models import Action
from tests.controlplane.chaos.conftest import chaos_pass, process_state, wait_until
from tests.controlplane.chaos.test_driver import steady_history


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def figures_of(html: str) -> list[dict]:
    match = re.search(r'<script id="chaos-run-figures" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(match.group(1))


def section(html: str, name: str) -> str:
    return re.search(rf'<section class="card" id="{name}">(.*?)</section>', html, re.S).group(1)


@pytest.mark.django_db
def test_a_finished_run_shows_its_verdict_checks_charts_requests_faults_and_actions(
        experiment, world, gateway, operator, viewer, agent_inline, django_capture_on_commit_callbacks):
    t = time.time()
    ok = steady_history(gateway, t)
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
    wait_until("the decode worker to stop", lambda: process_state(world["handle"].pid) == "stopped")
    gateway.serve(ok + 10, errors=3)  # a fifth fail during the fault: the error check deviates
    gateway.migrations = 2
    chaos_pass(now=t + 2)
    with django_capture_on_commit_callbacks(execute=True):
        assert drive_run(run.pk, now=t + 6) == "reverted"
    gateway.serve(ok + 20, errors=3)
    chaos_pass(now=t + 7)
    gateway.serve(ok + 30, errors=3)
    chaos_pass(now=t + 9)
    run.refresh_from_db()
    assert run.verdict == Verdict.PASSED

    response = signed_in(viewer).get(f"/deployments/demo/chaos/runs/{run.pk}")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-testid="verdict">passed</span>' in html and 'http-equiv="refresh"' not in html
    assert "recovery time <strong>3.0 s</strong>" in html
    checks = section(html, "hypothesis")
    # error_ratio: held before, failed during (both passes), holds after; the ready decode worker always held.
    error_row = re.search(r'<tr data-check="0">(.*?)</tr>', checks, re.S).group(1)
    assert re.search(r'data-phase="before">.*?pill ok', error_row, re.S)
    assert re.search(r'data-phase="during">.*?failed 2 of 2', error_row, re.S)
    assert re.search(r'data-phase="after">.*?pill ok', error_row, re.S)
    assert "≤ 0.05<" in error_row
    counts = dict(re.findall(r'data-count="(\w+)">(\d+)<', section(html, "requests")))
    assert counts == {"sent": "33", "failed": "3", "migrated": "2", "retried": "0"}

    injected = Action.objects.get(params__event="fault_injected")
    reverted = Action.objects.get(params__event="fault_reverted")
    faults = section(html, "faults")
    assert f'href="/api/v1/actions/{injected.pk}/"' in faults and f'href="/api/v1/actions/{reverted.pk}/"' in faults
    assert "paused" in faults and "resumed" in faults
    ttft_row = re.search(r'<tr data-check="1">(.*?)</tr>', checks, re.S).group(1)
    assert "≤ 0.099 (2× before)" in ttft_row  # twice the P99 before the faults (its histogram bucket)
    started = Action.objects.get(params__event="chaos_started")
    assert f'href="/api/v1/actions/{started.pk}/"' in section(html, "run-actions")

    figures = figures_of(html)
    assert [f["key"] for f in figures] == ["check-0", "check-1", "check-2"]
    error_chart = figures[0]
    judged = next(trace for trace in error_chart["data"] if trace["name"] == "judged by the run")
    # In percent: the baseline, the two passes during the fault, then the passes after it that had data (the first
    # one's window since the revert held no request yet: no point rather than a zero).
    assert [round(y, 2) for y in judged["y"]] == [0.0, 13.04, 23.08, 0.0]
    limit = next(trace for trace in error_chart["data"] if trace["name"].startswith("limit"))
    assert limit["y"] == [5.0, 5.0] and limit["line"]["dash"] == "dash"
    # The fault window, shaded as on the deployment page, inside a range with a margin on both sides.
    shapes = error_chart["layout"]["shapes"]
    assert len(shapes) == 1 and shapes[0]["x0"] == int(injected.created_at.timestamp() * 1000)
    x0, x1 = error_chart["layout"]["xaxis"]["range"]
    assert x0 < int(run.started_at.timestamp() * 1000) - 59_000 and x1 > shapes[0]["x1"]
    assert f"chaos run {run.pk}: pause" in [a["text"] for a in error_chart["layout"]["annotations"]]


@pytest.mark.django_db
def test_a_run_in_progress_shows_its_live_report_and_the_card_links_it(
        experiment, world, gateway, operator, viewer, outsider, agent_inline, django_capture_on_commit_callbacks):
    t = time.time()
    ok = steady_history(gateway, t)
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
    gateway.serve(ok + 10)
    chaos_pass(now=time.time())
    assert ChaosRun.objects.get().status == RunStatus.RUNNING

    html = signed_in(viewer).get(f"/deployments/demo/chaos/runs/{run.pk}").content.decode()
    assert 'http-equiv="refresh" content="5"' in html and 'data-testid="verdict">running</span>' in html
    assert re.search(r'data-phase="during">.*?pill ok">held', section(html, "hypothesis"), re.S)
    # Its progress, not reasons for a verdict it has not earned (no revert yet is not "no revert reported").
    assert 'id="reasons"' not in html and 'id="progress"' in html and "the faults end in" in html
    report = signed_in(viewer).get(f"/api/v1/deployments/demo/chaos/runs/{run.pk}/report").json()
    assert report["reasons"] == [] and report["verdict"] is None
    assert any("injected" in line for line in report["progress"]), report["progress"]
    card = signed_in(viewer).get("/deployments/demo/").content.decode()
    assert f'href="/deployments/demo/chaos/runs/{run.pk}"' in card

    assert signed_in(viewer).get(f"/deployments/demo/chaos/runs/{run.pk + 1}").status_code == 404
    assert signed_in(outsider).get(f"/deployments/demo/chaos/runs/{run.pk}").status_code == 403
    assert Client().get(f"/deployments/demo/chaos/runs/{run.pk}").status_code == 302  # to the login page
