"""The deployment page's charts shade the windows in which a chaos fault was active (from the agents' injected and
reverted Action rows): a run's fault is a band on every chart of charts.json and stages.json, open while the fault
is, closed at its revert; a failed injection, a fault outside the range and another deployment's draw nothing."""
from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import pytest
from django.test import Client

from controlplane.agent import fault_holds, faults
from controlplane.chaos.services import run_abort, run_start
from controlplane.models import Action, ActionStatus, ActorType
from dashboards.chaos import chaos_windows
from dashboards.charts import CHAOS_FILL, empty_figure, shade_windows
from tests.controlplane.chaos.test_driver import steady_history


def _json(user, what: str) -> dict:
    client = Client()
    client.force_login(user)
    response = client.get(f"/deployments/demo/{what}.json?range=15m")
    assert response.status_code == 200
    return response.json()


def _bands(figure: dict) -> list[tuple[int, int]]:
    return [(shape["x0"], shape["x1"]) for shape in figure["layout"].get("shapes", [])
            if shape.get("fillcolor") == CHAOS_FILL]


@pytest.mark.django_db
def test_every_chart_shades_a_runs_fault_from_its_injection_to_its_revert(
        experiment, world, gateway, operator, viewer, agent_inline, django_capture_on_commit_callbacks):
    steady_history(gateway, time.time())
    with django_capture_on_commit_callbacks(execute=True):
        run = run_start(experiment=experiment, actor=operator)
    injected = Action.objects.get(idempotency_key=faults.injected_key(run.faults[0]["key"]))

    charts = _json(viewer, "charts")
    [window] = charts["chaos_windows"]
    assert window["run"] == run.pk and window["fault"] == "pause" and window["label"] == f"chaos run {run.pk}: pause"
    assert window["start"] == pytest.approx(injected.created_at.timestamp(), abs=0.01)
    assert window["end"] == pytest.approx(time.time(), abs=5)  # still active: open to now
    stages = _json(viewer, "stages")
    assert stages["chaos_windows"][0]["run"] == run.pk
    figures = list(charts["figures"].values()) + list(stages["figures"].values())
    assert len(figures) > 5
    for figure in figures:
        [(x0, x1)] = _bands(figure)
        assert x0 == int(window["start"] * 1000) and x1 > x0
        assert f"chaos run {run.pk}: pause" in [note["text"] for note in figure["layout"]["annotations"]]

    with django_capture_on_commit_callbacks(execute=True):
        run_abort(run=run, actor=operator)
    reverted = Action.objects.get(idempotency_key=faults.reverted_key(run.faults[0]["key"]))
    time.sleep(0.05)  # "now" moves on; the band must not
    [window] = _json(viewer, "charts")["chaos_windows"]
    assert window["end"] == pytest.approx(reverted.created_at.timestamp(), abs=0.01)


def _row(deployment, key: str, event: str, at: datetime, *, status=ActionStatus.SUCCEEDED, run=7, fault="cpu_hog",
         result=None):
    Action.objects.create(kind=fault_holds.FAULT_KIND, deployment=deployment, actor_type=ActorType.SYSTEM, actor="node agent n",
                          status=status, idempotency_key=f"{key}:{event.split('_')[1]}", created_at=at,
                          params={"chaos_run": run, "fault": fault, "event": event}, result=result or {})


@pytest.mark.django_db
def test_windows_merge_a_runs_workers_clip_to_the_range_and_skip_failures(deployment):
    now = datetime.now(tz=timezone.utc)
    ago = lambda s: now - timedelta(seconds=s)  # noqa: E731
    # Run 7: a cpu_hog on two workers (one band), begun before the range, reverted inside it.
    _row(deployment, "chaos-7-0-w1", "fault_injected", ago(1000))
    _row(deployment, "chaos-7-0-w2", "fault_injected", ago(990))
    _row(deployment, "chaos-7-0-w1", "fault_reverted", ago(700))
    _row(deployment, "chaos-7-0-w2", "fault_reverted", ago(650))
    # Run 8: refused by the agent (no band); run 9: over before the range; run 10: no revert row, deadline passed.
    _row(deployment, "chaos-8-0-w1", "fault_injected", ago(500), status=ActionStatus.FAILED, run=8)
    _row(deployment, "chaos-9-0-w1", "fault_injected", ago(1300), run=9)
    _row(deployment, "chaos-9-0-w1", "fault_reverted", ago(1250), run=9)
    _row(deployment, "chaos-10-0-w1", "fault_injected", ago(300), run=10, fault="pause",
         result={"until": ago(200).timestamp()})
    start, end = ago(900).timestamp(), now.timestamp()
    windows = chaos_windows(deployment, start=start, end=end)
    assert [(w["run"], w["fault"]) for w in windows] == [(7, "cpu_hog"), (10, "pause")]
    assert windows[0]["start"] == start and windows[0]["end"] == pytest.approx(ago(650).timestamp())
    assert windows[1]["end"] == pytest.approx(ago(200).timestamp())


def test_shade_windows_adds_a_band_and_a_label_behind_the_lines():
    figure = empty_figure("TTFT", "no data", x_range=(1000.0, 2000.0))
    shade_windows(figure, [{"start": 1200.0, "end": 1300.5, "label": "chaos run 3: pause"}])
    [band] = figure["layout"]["shapes"]
    assert band["x0"] == 1_200_000 and band["x1"] == 1_300_500 and band["layer"] == "below"
    assert band["yref"] == "paper" and (band["y0"], band["y1"]) == (0, 1)
    assert [note["text"] for note in figure["layout"]["annotations"]] == ["no data", "chaos run 3: pause"]
    assert shade_windows({"data": [], "layout": {}}, []) == {"data": [], "layout": {}}
