"""The rollout page in Chromium: the overlaid charts drawn by plotly (served locally, under the page's CSP), the
split and step, and an operator's abort through its confirmation page."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


@pytest.fixture
def canary(fleet, operator):
    import time

    from controlplane.observability.catalog import METRIC_IDS
    from controlplane.observability.models import RevisionSample
    from controlplane.rollouts.services import rollout_start
    from controlplane.services.revisions import revision_add

    deployment = fleet["deployment"]
    revision_add(deployment=deployment, actor=operator, model_path=None, dtype=None, engine_settings=None)
    rollout = rollout_start(deployment=deployment, actor=operator, revision=3,
                            steps=[{"weight": 20, "duration_s": 600}])
    now = time.time()
    RevisionSample.objects.bulk_create([
        RevisionSample(ts=now + 5 * i, deployment_id=deployment.pk, revision=revision,
                       metric=METRIC_IDS["e2e_p99_seconds"], value=value + 0.01 * i)
        for i in range(6) for revision, value in ((2, 0.5), (3, 0.6))])
    return rollout


def test_an_operator_reads_the_charts_and_aborts_after_confirming(page, live_server, login, operator, canary,
                                                                  eager_reconcile, screenshot):
    from controlplane.rollouts.models import Rollout

    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    login(page, operator)
    page.goto(f"{live_server.url}/deployments/demo/rollouts/{canary.pk}/")
    page.wait_for_selector(".chart[data-chart='e2e_p99_seconds'] .main-svg")
    assert page.get_attribute(".chart[data-chart='e2e_p99_seconds']", "data-points") == "12"
    assert "stable #2 80%" in page.inner_text("#split") and "canary #3 20%" in page.inner_text("#split")
    screenshot(page, "rollout")

    page.click("[data-testid='abort']")
    page.wait_for_url(f"{live_server.url}/deployments/demo/rollouts/{canary.pk}/abort")
    assert Rollout.objects.get(pk=canary.pk).status == "running"
    page.fill("input[name=reason]", "canary too slow")
    page.click("[data-testid='confirm-abort']")
    page.wait_for_url(f"{live_server.url}/deployments/demo/rollouts/{canary.pk}/")
    assert page.inner_text("[data-testid='rollout-status']") == "aborted"
    assert Rollout.objects.get(pk=canary.pk).reason == "dashboard: canary too slow"
    assert errors == []
