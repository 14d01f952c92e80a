"""A rollout's audit rows name the rollout, its strategy and both revisions, and count steps from 1 as the pages
do: an abort during step 1 of 2 says step 1, not 0. The audit log and the deployment page's recent actions show it."""
from __future__ import annotations

import pytest

from controlplane.models import Action, ActionKind
from controlplane.rollouts.services import rollout_abort, rollout_pause, rollout_resume, rollout_start
from controlplane.services.revisions import revision_add

STEPS = [{"weight": 10, "duration_s": 60}, {"weight": 50, "duration_s": 60}]


@pytest.fixture
def canary(deployment, operator):
    revision_add(deployment=deployment, actor=operator, model_path=None, dtype=None, engine_settings=None)
    return rollout_start(deployment=deployment, actor=operator, revision=2, steps=STEPS)


def test_an_abort_during_step_1_of_2_records_step_1_with_the_strategy_and_revisions(canary, operator):
    rollout_abort(rollout=canary, actor=operator, reason="too slow")
    params = Action.objects.get(kind=ActionKind.ABORT).params
    assert {key: params[key] for key in ("rollout", "strategy", "revision", "stable_revision", "step", "num_steps")} \
        == {"rollout": canary.pk, "strategy": "canary", "revision": 2, "stable_revision": 1, "step": 1,
            "num_steps": 2}


def test_pause_and_resume_name_the_step_in_progress_from_1(canary, operator):
    rollout_pause(rollout=canary, actor=operator)
    rollout_resume(rollout=canary, actor=operator)
    events = Action.objects.filter(kind=ActionKind.ROLLOUT, params__event__in=["paused", "resumed"]).order_by("id")
    assert [(a.params["event"], a.params["step"], a.params["strategy"]) for a in events] == [
        ("paused", 1, "canary"), ("resumed", 1, "canary")]


def test_the_audit_log_and_the_deployment_page_name_rollout_strategy_revision_and_step(canary, operator,
                                                                                       client_for, viewer):
    rollout_abort(rollout=canary, actor=operator, reason="too slow")
    abort = Action.objects.get(kind=ActionKind.ABORT)
    started = Action.objects.get(kind=ActionKind.ROLLOUT, params__event="started")
    expected = f"canary rollout #{canary.pk} aborted: revision #2 beside #1, step 1 of 2"
    for url in ("/actions/", "/deployments/demo/"):
        html = client_for(viewer).get(url).content.decode()
        row = html[html.index(f'data-testid="rollout-of-{abort.pk}"'):][:400]
        text = row.replace(f'<a href="/deployments/demo/rollouts/{canary.pk}/">#{canary.pk}</a>', f"#{canary.pk}")
        assert expected in text, url
        assert f'data-testid="rollout-of-{started.pk}"' in html, url


def test_an_ab_test_is_named_ab(deployment, operator, client_for, viewer):
    revision_add(deployment=deployment, actor=operator, model_path=None, dtype=None, engine_settings=None)
    rollout = rollout_start(deployment=deployment, actor=operator, revision=2, strategy="ab", duration_s=600)
    rollout_pause(rollout=rollout, actor=operator)
    html = client_for(viewer).get("/actions/").content.decode()
    assert "A/B rollout" in html and "paused: revision #2 beside #1, step 1 of 1" in html
