"""Starting a rollout: one per deployment, bad input a 400 naming the field, idempotent under a repeated key."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.models import Action, ActionKind
from controlplane.rollouts.models import Rollout, RolloutStatus
from controlplane.rollouts.services import rollout_abort, rollout_start


def _error(call) -> ControlPlaneError:
    with pytest.raises(ControlPlaneError) as info:
        call()
    return info.value


def test_a_canary_starts_beside_the_current_revision(steady, operator):
    rollout = rollout_start(deployment=steady, actor=operator, revision=2,
                            steps=[{"weight": 10, "duration_s": 5}])
    steady.refresh_from_db()
    assert steady.current_revision.number == 1  # stable stays current until promotion
    assert (rollout.status, rollout.revision.number, rollout.stable_revision.number) == ("running", 2, 1)
    assert rollout.steps == [{"weight": 10, "duration_s": 5.0, "analysis": True}]
    assert rollout.analysis["min_requests"] == 20
    action = Action.objects.get(kind=ActionKind.ROLLOUT)
    assert action.params["rollout"] == rollout.pk and action.params["event"] == "started"


def test_a_revision_object_creates_a_new_revision_that_is_not_current(steady, operator):
    rollout = rollout_start(deployment=steady, actor=operator, revision={"engine_settings": {"threads": 2}})
    steady.refresh_from_db()
    assert rollout.revision.number == 3 and steady.current_revision.number == 1
    assert rollout.revision.engine_settings == {"common": {"threads": 2}}


def test_a_second_rollout_is_a_409_until_the_first_ends(steady, operator):
    first = rollout_start(deployment=steady, actor=operator, revision=2)
    error = _error(lambda: rollout_start(deployment=steady, actor=operator, revision=2))
    assert error.status == 409 and error.extra["rollout_id"] == first.pk
    rollout_abort(rollout=first, actor=operator, reason="test")
    assert rollout_start(deployment=steady, actor=operator, revision=2).status == RolloutStatus.RUNNING


def test_a_new_revision_or_rollback_is_a_409_while_a_rollout_runs(steady, operator):
    from controlplane.services import deployment_rollback, revision_create

    rollout_start(deployment=steady, actor=operator, revision=2)
    assert _error(lambda: revision_create(deployment=steady, actor=operator, comment="x")).status == 409
    assert _error(lambda: deployment_rollback(deployment=steady, actor=operator, revision_number=2)).status == 409


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"revision": 9}, "revision"),
    ({"revision": 1}, "revision"),
    ({"revision": "two"}, "revision"),
    ({"revision": {"engine_settings": {"threads": 0}}}, "engine_settings.common.threads"),
    ({"revision": {"colour": "red"}}, "revision.colour"),
    ({"revision": 2, "strategy": "blue-green"}, "strategy"),
    ({"revision": 2, "strategy": "rolling"}, "strategy"),
    ({"revision": 2, "steps": []}, "steps"),
    ({"revision": 2, "steps": [{"weight": 101, "duration_s": 5}]}, "steps[0].weight"),
    ({"revision": 2, "steps": [{"weight": 10}]}, "steps[0].duration_s"),
    ({"revision": 2, "steps": [{"weight": 10, "duration_s": 5, "pause": True}]}, "steps[0].pause"),
    ({"revision": 2, "analysis": {"max_latency_ratio": 0.5}}, "analysis.max_latency_ratio"),
    ({"revision": 2, "analysis": {"p42": 1}}, "analysis.p42"),
    ({"revision": 2, "steps": [{"weight": 0, "duration_s": 5}]}, "steps[0].analysis"),
    ({"revision": 2, "strategy": "ab"}, "duration_s"),
    ({"revision": 2, "strategy": "ab", "duration_s": 60, "split": 100}, "split"),
    ({"revision": 2, "split": 50}, "split"),
])
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(steady, operator, kwargs, field):
    error = _error(lambda: rollout_start(deployment=steady, actor=operator, **kwargs))
    assert error.status == 400 and error.extra["field"] == field, error.message
    assert not Rollout.objects.exists()
    assert steady.revisions.count() == 2


def test_the_same_idempotency_key_returns_the_same_rollout(steady, operator):
    first = rollout_start(deployment=steady, actor=operator, revision=2, idempotency_key="canary-1")
    again = rollout_start(deployment=steady, actor=operator, revision=2, idempotency_key="canary-1")
    assert again.pk == first.pk and Rollout.objects.count() == 1
    other = _error(lambda: rollout_start(deployment=steady, actor=operator, revision=2, steps=[
        {"weight": 50, "duration_s": 5}], idempotency_key="canary-1"))
    assert other.status == 422


def test_test_fault_is_no_engine_setting_any_more(steady, operator):
    """Workers are made to fail from outside (a chaos fault, docs/chaos.md), never by a revision's setting."""
    error = _error(lambda: rollout_start(deployment=steady, actor=operator,
                                         revision={"engine_settings": {"test_fault": "error"}}))
    assert error.status == 400 and error.extra["field"] == "engine_settings.common.test_fault"
