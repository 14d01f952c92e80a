"""revision_create and deployment_rollback: immutable revisions, one rollout at a time."""
from __future__ import annotations

import pytest

from controlplane.errors import ControlPlaneError
from controlplane.models import Revision
from controlplane.models.deployments import RevisionImmutableError
from controlplane.services import action_succeed, deployment_rollback, revision_create

pytestmark = pytest.mark.django_db


def test_a_revision_cannot_be_changed_once_saved(deployment):
    revision = deployment.current_revision
    revision.dtype = "float16"
    with pytest.raises(RevisionImmutableError):
        revision.save()
    assert Revision.objects.get(pk=revision.pk).dtype == "auto"


def test_a_new_revision_is_numbered_after_the_highest(deployment, admin):
    action_succeed(action_id=revision_create(deployment=deployment, actor=admin).pk)
    action_succeed(action_id=deployment_rollback(deployment=deployment, actor=admin).pk)
    action = revision_create(deployment=deployment, actor=admin, dtype="float16")
    assert action.params["revision"] == 3
    deployment.refresh_from_db()
    assert (deployment.current_revision.number, deployment.current_revision.dtype) == (3, "float16")


def test_a_deployment_runs_its_model_in_the_model_dtype_unless_told_and_a_choice_stays(make_deployment, admin):
    assert make_deployment("own").current_revision.dtype == "auto"
    pinned = make_deployment("pinned", dtype="float32")
    action_succeed(action_id=revision_create(deployment=pinned, actor=admin, comment="more threads",
                                             engine_settings={"threads": 2}).pk)
    pinned.refresh_from_db()
    assert (pinned.current_revision.number, pinned.current_revision.dtype) == (2, "float32")


def test_a_new_revision_validates_its_model_path(deployment, admin, tmp_path):
    with pytest.raises(ControlPlaneError) as err:
        revision_create(deployment=deployment, actor=admin, model_path=str(tmp_path / "nope"))
    assert err.value.status == 400 and err.value.extra["field"] == "model_path"


def test_rollback_defaults_to_the_revision_below_the_current(deployment, admin):
    for _ in range(2):
        action_succeed(action_id=revision_create(deployment=deployment, actor=admin).pk)
    action = deployment_rollback(deployment=deployment, actor=admin, reason="bad build")
    assert (action.params["from_revision"], action.params["to_revision"]) == (3, 2)
    assert action.status == "running" and action.started_at is not None


def test_a_new_revision_still_refuses_while_a_rollback_rolls_out(deployment, admin):
    revision_create(deployment=deployment, actor=admin)
    deployment_rollback(deployment=deployment, actor=admin)  # preempts the revision's replacement
    with pytest.raises(ControlPlaneError) as err:
        revision_create(deployment=deployment, actor=admin, comment="another")
    assert err.value.status == 409
