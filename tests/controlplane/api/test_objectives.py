"""A deployment's latency objectives: defaults at create, set at create, changed by an operator's PATCH (audited as
an `objectives` action), refused with a 400 naming the objective, never half-applied."""
from __future__ import annotations

import pytest

from controlplane.models import Action, Deployment

pytestmark = pytest.mark.django_db

DEFAULTS = {"ttft_p99_seconds": 10.0, "itl_p99_seconds": 1.0, "e2e_p99_seconds": 60.0}


def test_a_new_deployment_has_the_default_objectives(admin_api, model_dir):
    response = admin_api.post("/api/v1/deployments/", {"name": "chat", "mode": "colocated",
                                                       "model_path": str(model_dir)}, format="json")
    assert response.status_code == 202, response.content
    assert response.json()["deployment"]["objectives"] == DEFAULTS


def test_objectives_given_at_create_are_kept_and_the_rest_default(admin_api, model_dir):
    response = admin_api.post("/api/v1/deployments/", {"name": "chat", "mode": "disaggregated",
                                                       "model_path": str(model_dir),
                                                       "objectives": {"ttft_p99_seconds": 0.8}}, format="json")
    assert response.status_code == 202, response.content
    assert Deployment.objects.get(name="chat").objectives == {**DEFAULTS, "ttft_p99_seconds": 0.8}
    assert Action.objects.get(kind="create").params["objectives"]["ttft_p99_seconds"] == 0.8


@pytest.mark.parametrize("objectives, field, words", [
    ({"ttft_p99": 1}, "objectives.ttft_p99", "not an objective"),
    ({"itl_p99_seconds": 0}, "objectives.itl_p99_seconds", "more than 0"),
    ({"itl_p99_seconds": "fast"}, "objectives.itl_p99_seconds", "number of seconds"),
    ({"e2e_p99_seconds": True}, "objectives.e2e_p99_seconds", "number of seconds"),
    ({"e2e_p99_seconds": 5000}, "objectives.e2e_p99_seconds", "at most 3600"),
])
def test_a_bad_objective_at_create_is_a_400_naming_it_and_nothing_is_created(admin_api, model_dir, objectives,
                                                                             field, words):
    response = admin_api.post("/api/v1/deployments/", {"name": "chat", "mode": "colocated",
                                                       "model_path": str(model_dir), "objectives": objectives},
                              format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field and words in error["message"]
    assert not Deployment.objects.filter(name="chat").exists()


def test_an_operator_changes_one_objective_and_it_is_audited(deployment, operator, operator_api):
    response = operator_api.patch("/api/v1/deployments/demo/", {"objectives": {"itl_p99_seconds": 0.2},
                                                                "reason": "tighter ITL for chat"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["deployment"]["objectives"] == {**DEFAULTS, "itl_p99_seconds": 0.2}
    action = Action.objects.get(pk=body["action"]["id"])
    assert (action.kind, action.status, action.actor, action.reason) == ("objectives", "succeeded", operator.username,
                                                                        "tighter ITL for chat")
    assert action.params == {"from": DEFAULTS, "to": {**DEFAULTS, "itl_p99_seconds": 0.2}}


def test_a_bad_patch_changes_nothing(deployment, operator_api):
    response = operator_api.patch("/api/v1/deployments/demo/",
                                  {"objectives": {"itl_p99_seconds": 0.2, "ttft_p99_seconds": -1}}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "objectives.ttft_p99_seconds"
    deployment.refresh_from_db()
    assert deployment.objectives == DEFAULTS
    assert not Action.objects.filter(kind="objectives").exists()


@pytest.mark.parametrize("body, field", [({}, "objectives"), ({"objectives": {}}, "objectives"),
                                         ({"objectives": [1]}, "objectives"), ({"mode": "colocated"}, "mode")])
def test_a_patch_without_objectives_is_a_400_naming_the_field(deployment, operator_api, body, field):
    response = operator_api.patch("/api/v1/deployments/demo/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.content.decode()


def test_a_viewer_may_not_change_objectives(deployment, viewer_api):
    response = viewer_api.patch("/api/v1/deployments/demo/", {"objectives": {"itl_p99_seconds": 0.2}}, format="json")
    assert response.status_code == 403
    deployment.refresh_from_db()
    assert deployment.objectives == DEFAULTS


def test_deleting_stays_an_admins_write(deployment, operator_api):
    assert operator_api.delete("/api/v1/deployments/demo/").status_code == 403


@pytest.mark.parametrize("body, words", [
    ({"objectives": {"ttft_p99_seconds": 2}, "sampling_defaults": {"temperature": 0}}, "not both"),
    ({"reason": "nothing to change"}, "give sampling_defaults or objectives"),
])
def test_a_patch_changes_exactly_one_setting_else_400_and_nothing_changes(admin_api, operator_api, model_dir, body,
                                                                         words):
    created = admin_api.post("/api/v1/deployments/", {"name": "chat", "mode": "colocated",
                                                      "model_path": str(model_dir)}, format="json")
    assert created.status_code == 202, created.content
    response = operator_api.patch("/api/v1/deployments/chat/", body, format="json")
    assert response.status_code == 400, response.content
    assert words in response.json()["error"]["message"]
    deployment = Deployment.objects.get(name="chat")
    assert deployment.objectives == DEFAULTS and deployment.sampling_defaults == {}
    assert not Action.objects.filter(kind__in=["objectives", "sampling"]).exists()
