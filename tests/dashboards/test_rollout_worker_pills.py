"""The workers table names what a worker's revision is to a rollout: the tried revision's workers are "canary" (or
"B" of an A/B test, stable's "A"), never "old"; a revision being replaced outside a rollout is "old"."""
from __future__ import annotations

import re

import pytest

from controlplane.rollouts.services import rollout_abort, rollout_start
from controlplane.services.revisions import revision_add


@pytest.fixture
def two_revisions(deployment, operator, make_worker):
    """demo on revision 1 with a ready prefill and decode worker; revision 2 exists, not current."""
    stable = [make_worker(deployment, "prefill"), make_worker(deployment, "decode")]
    revision_add(deployment=deployment, actor=operator, model_path=None, dtype=None, engine_settings=None)
    tried = deployment.revisions.get(number=2)
    return {"stable": stable, "tried": [make_worker(deployment, "prefill", revision=tried),
                                        make_worker(deployment, "decode", revision=tried)]}


def _pills(html: str) -> dict[int, str]:
    return {int(pk): text for pk, text in re.findall(r'data-testid="revision-pill-(\d+)">([^<]*)<', html)}


def test_the_tried_revision_of_a_canary_is_labelled_canary_not_old(two_revisions, deployment, operator,
                                                                  client_for, viewer):
    rollout_start(deployment=deployment, actor=operator, revision=2, steps=[{"weight": 10, "duration_s": 60}])
    pills = _pills(client_for(viewer).get("/deployments/demo/live").content.decode())
    assert {pills[w.pk] for w in two_revisions["tried"]} == {"canary"}
    assert not any(w.pk in pills for w in two_revisions["stable"])
    assert "old" not in pills.values()


def test_an_ab_test_labels_its_revisions_a_and_b(two_revisions, deployment, operator, client_for, viewer):
    rollout_start(deployment=deployment, actor=operator, revision=2, strategy="ab", split=50, duration_s=600)
    pills = _pills(client_for(viewer).get("/deployments/demo/").content.decode())
    assert {pills[w.pk] for w in two_revisions["tried"]} == {"B"}
    assert {pills[w.pk] for w in two_revisions["stable"]} == {"A"}


def test_after_an_abort_the_tried_revisions_draining_workers_are_old(two_revisions, deployment, operator,
                                                                    client_for, viewer):
    rollout = rollout_start(deployment=deployment, actor=operator, revision=2,
                            steps=[{"weight": 10, "duration_s": 60}])
    rollout_abort(rollout=rollout, actor=operator, reason="too slow")
    pills = _pills(client_for(viewer).get("/deployments/demo/live").content.decode())
    assert {pills[w.pk] for w in two_revisions["tried"]} == {"old"}
