"""The rollout page: split, step and timer, analysis numbers and chart data (stable solid, canary dashed); buttons
for operators only, promote and abort behind a confirmation page; the deployment page's banner while it runs."""
from __future__ import annotations

import json
import re
import time

import pytest

from controlplane.models import WorkerRole
from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import RevisionSample
from controlplane.rollouts.models import AnalysisRun, Rollout, RolloutStatus


@pytest.fixture
def canary(deployment, operator, make_worker):
    from controlplane.rollouts.services import rollout_start
    from controlplane.services.revisions import revision_add

    make_worker(deployment, "prefill")
    make_worker(deployment, "decode")
    make_worker(deployment, WorkerRole.GATEWAY)
    revision_add(deployment=deployment, actor=operator, model_path=None, dtype=None, engine_settings=None)
    rollout = rollout_start(deployment=deployment, actor=operator, revision=2,
                            steps=[{"weight": 10, "duration_s": 60}, {"weight": 50, "duration_s": 60}])
    numbers = {"requests": 40, "errors": 0, "error_ratio": 0.0, "e2e_p99_seconds": 0.5}
    AnalysisRun.objects.create(
        rollout=rollout, step_index=0, verdict="passing",
        metrics={"stable": numbers, "canary": {**numbers, "requests": 21, "e2e_p99_seconds": 0.55}})
    # What the scrape cycle stores per revision from the gateway; one sample from before the rollout is left out.
    now = time.time()
    e2e = METRIC_IDS["e2e_p99_seconds"]
    RevisionSample.objects.bulk_create([
        RevisionSample(ts=now, deployment_id=deployment.pk, revision=1, metric=e2e, value=0.5),
        RevisionSample(ts=now, deployment_id=deployment.pk, revision=2, metric=e2e, value=0.55),
        RevisionSample(ts=now - 3600, deployment_id=deployment.pk, revision=1, metric=e2e, value=9.0)])
    return rollout


def _figures(html: str) -> list[dict]:
    match = re.search(r'<script id="rollout-figures" type="application/json">(.*?)</script>', html, re.S)
    return json.loads(match.group(1))


def test_a_viewer_sees_the_split_the_step_and_the_numbers_but_no_buttons(canary, client_for, viewer):
    html = client_for(viewer).get(f"/deployments/demo/rollouts/{canary.pk}/").content.decode()
    assert "stable #1 90%" in html and "canary #2 10%" in html
    assert "Step 1 of 2: 10% for 60 s, analysed." in html
    assert "Waiting for the canary workers" in html  # the timer starts once they are ready
    assert "a step still short of requests 3600 s after its end aborts" in html  # analysis.max_wait_s's default
    assert ">21<" in html and "0.550" in html
    e2e = next(f for f in _figures(html) if f["key"] == "e2e_p99_seconds")
    # Drawn like the deployment page's charts: latencies under a second in ms, the unit on the axis.
    assert [(t["name"], t["line"]["dash"], t["y"]) for t in e2e["data"]] == [
        ("stable (#1)", "solid", [500.0]), ("canary (#2)", "dash", [pytest.approx(550.0)])]
    assert e2e["layout"]["yaxis"]["ticksuffix"] == " ms"
    assert 'data-testid="abort"' not in html and 'data-testid="pause"' not in html
    assert client_for(viewer).post(f"/deployments/demo/rollouts/{canary.pk}/pause").status_code == 403


def test_an_operator_aborts_through_the_confirmation_page(canary, client_for, operator):
    client = client_for(operator)
    html = client.get(f"/deployments/demo/rollouts/{canary.pk}/").content.decode()
    assert 'data-testid="abort"' in html and 'data-testid="promote"' in html
    confirm = client.get(f"/deployments/demo/rollouts/{canary.pk}/abort")
    assert confirm.status_code == 200 and b"All traffic goes back to" in confirm.content
    assert Rollout.objects.get().status == RolloutStatus.RUNNING  # a GET changes nothing
    response = client.post(f"/deployments/demo/rollouts/{canary.pk}/abort", {"reason": "too slow"})
    assert response.status_code == 302
    rollout = Rollout.objects.get()
    assert rollout.status == RolloutStatus.ABORTED and "too slow" in rollout.reason


def test_the_deployment_page_shows_a_banner_while_a_rollout_runs(canary, client_for, viewer, operator):
    from controlplane.rollouts.services import rollout_abort

    html = client_for(viewer).get("/deployments/demo/").content.decode()
    assert 'data-testid="rollout-banner"' in html and "#2 takes 10% of traffic" in html
    assert f"/deployments/demo/rollouts/{canary.pk}/" in html
    rollout_abort(rollout=canary, actor=operator)
    assert 'data-testid="rollout-banner"' not in client_for(viewer).get("/deployments/demo/").content.decode()
