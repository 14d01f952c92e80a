"""POST /api/v1/deployments/{name}/rollback."""
from __future__ import annotations

import pytest

from controlplane.models import Action, Deployment

pytestmark = pytest.mark.django_db


def rollback(client, body=None):
    return client.post("/api/v1/deployments/demo/rollback", body or {}, format="json")


def test_it_rolls_back_to_the_previous_revision_by_default(operator_api, deployment, second_revision):
    response = rollback(operator_api, {"reason": "p99 regressed"})
    assert response.status_code == 202, response.content
    action = response.json()["action"]
    assert action["kind"] == "rollback"
    assert action["status"] == "running"
    assert action["params"]["from_revision"] == 2 and action["params"]["to_revision"] == 1
    assert response.json()["deployment"]["current_revision"] == 1
    assert Deployment.objects.get(pk=deployment.pk).current_revision.number == 1


def test_it_rolls_back_to_a_named_revision(operator_api, admin, deployment, second_revision):
    from controlplane.services import action_succeed, revision_create

    action_succeed(action_id=revision_create(deployment=deployment, actor=admin, comment="three").pk)
    response = rollback(operator_api, {"revision": 1})
    assert response.status_code == 202
    assert Deployment.objects.get(pk=deployment.pk).current_revision.number == 1


def test_it_refuses_an_unknown_revision_and_lists_the_known_ones(operator_api, deployment, second_revision):
    response = rollback(operator_api, {"revision": 7})
    assert response.status_code == 400
    assert "no revision 7 (it has [1, 2])" in response.json()["error"]["message"]


def test_it_refuses_the_current_revision(operator_api, deployment, second_revision):
    response = rollback(operator_api, {"revision": 2})
    assert response.status_code == 400
    assert "already the current revision" in response.json()["error"]["message"]


def test_it_refuses_when_there_is_no_earlier_revision(operator_api, deployment):
    response = rollback(operator_api)
    assert response.status_code == 400
    assert "no revision before 1" in response.json()["error"]["message"]


def test_a_rollback_preempts_a_new_revisions_replacement_that_still_runs(operator_api, admin, deployment,
                                                                         second_revision):
    """The operator who rolls back is the one whose new revision is bad: no waiting for its replacement to end."""
    from controlplane.services import revision_create

    running = revision_create(deployment=deployment, actor=admin, comment="three: bad")  # its replacement runs
    response = rollback(operator_api, {"reason": "revision 3 answers garbage"})
    assert response.status_code == 202, response.content
    action = response.json()["action"]
    assert (action["params"]["from_revision"], action["params"]["to_revision"]) == (3, 2)
    assert action["params"]["preempted"] == {"action": running.pk, "kind": "revision", "revision": 3}
    superseded = Action.objects.get(pk=running.pk)
    assert superseded.status == "failed" and f"preempted by the rollback to revision 2 (action {action['id']})" \
        in superseded.error
    assert Deployment.objects.get(pk=deployment.pk).current_revision.number == 2


def test_a_rollback_preempts_a_running_rollback_too(operator_api, deployment, second_revision):
    first = rollback(operator_api).json()["action"]
    response = rollback(operator_api, {"revision": 2})
    assert response.status_code == 202, response.content
    assert response.json()["action"]["params"]["preempted"]["action"] == first["id"]
    assert Action.objects.get(pk=first["id"]).status == "failed"
    assert Deployment.objects.get(pk=deployment.pk).current_revision.number == 2


def test_it_allows_the_next_rollback_once_the_rollout_finished(operator_api, deployment, second_revision):
    from controlplane.services import action_succeed

    first = rollback(operator_api).json()["action"]
    action_succeed(action_id=first["id"])
    assert rollback(operator_api, {"revision": 2}).status_code == 202


@pytest.mark.parametrize("revision", [0, -1, "two", 2**70, True, 1.5])
def test_it_refuses_a_revision_that_is_not_a_positive_integer(operator_api, deployment, second_revision, revision):
    response = rollback(operator_api, {"revision": revision})
    assert response.status_code == 400
    assert "revision" in response.json()["error"]["fields"]


def test_it_refuses_an_unknown_field_instead_of_rolling_back_somewhere_else(operator_api, admin, deployment,
                                                                           second_revision):
    from controlplane.services import action_succeed, revision_create

    action_succeed(action_id=revision_create(deployment=deployment, actor=admin, comment="three").pk)
    # `to_revision` is what the action reports, not what the request takes: ignored, it would roll back to 2.
    response = rollback(operator_api, {"to_revision": 1})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert "to_revision" in error["fields"] and "unknown field" in error["message"]
    assert "revision" in error["message"]  # it names the fields the request does accept
    assert Deployment.objects.get(pk=deployment.pk).current_revision.number == 3
    assert not Action.objects.filter(kind="rollback").exists()
