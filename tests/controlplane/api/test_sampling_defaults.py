"""A deployment's sampling defaults: set at create and by PATCH (operator, audited as a `sampling` action),
checked by the gateway's rules for a request's fields, served to the gateway in /endpoints."""
from __future__ import annotations

import pytest

from controlplane.models import Action, Deployment
from tests.procs import free_port


def test_create_stores_them_and_the_endpoints_answer_serves_them(admin_api, viewer_api, model_dir):
    response = admin_api.post("/api/v1/deployments/", {
        "name": "chat", "mode": "colocated", "model_path": str(model_dir), "gateway_port": free_port(),
        "sampling_defaults": {"temperature": 0, "top_k": -1, "max_tokens": 64, "top_p": None}}, format="json")
    assert response.status_code == 202, response.content
    # top_k -1 is "no top-k", stored as 0 as the gateway reads it; a null leaves a field unset.
    expected = {"temperature": 0.0, "top_k": 0, "max_tokens": 64}
    assert response.json()["deployment"]["sampling_defaults"] == expected
    assert response.json()["action"]["params"]["sampling_defaults"] == expected
    assert viewer_api.get("/api/v1/deployments/chat/endpoints").json()["sampling_defaults"] == expected


def test_an_operator_patches_them_and_the_change_is_an_action(operator_api, viewer_api, deployment):
    response = operator_api.patch("/api/v1/deployments/demo/", {
        "sampling_defaults": {"temperature": 0.7, "top_p": 0.9}, "reason": "livelier"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["action"]["kind"] == "sampling" and body["action"]["status"] == "succeeded"
    assert body["action"]["actor"] == "otto-operator" and body["action"]["reason"] == "livelier"
    assert body["action"]["params"] == {"from": {}, "to": {"temperature": 0.7, "top_p": 0.9}}
    assert body["deployment"]["sampling_defaults"] == {"temperature": 0.7, "top_p": 0.9}
    assert viewer_api.get("/api/v1/deployments/demo/endpoints").json()["sampling_defaults"] == {
        "temperature": 0.7, "top_p": 0.9}
    cleared = operator_api.patch("/api/v1/deployments/demo/", {"sampling_defaults": None}, format="json")
    assert cleared.json()["deployment"]["sampling_defaults"] == {}


def test_a_viewer_may_not_patch_them(viewer_api, deployment):
    response = viewer_api.patch("/api/v1/deployments/demo/", {"sampling_defaults": {"temperature": 0}},
                                format="json")
    assert response.status_code == 403
    assert Deployment.objects.get(pk=deployment.pk).sampling_defaults == {}


def test_deleting_stays_an_admins_right(operator_api, deployment):
    assert operator_api.delete("/api/v1/deployments/demo/").status_code == 403


@pytest.mark.parametrize("defaults, field, fragment", [
    ({"temperature": 2.5}, "sampling_defaults.temperature", "must be in [0, 2]"),
    ({"temperature": "hot"}, "sampling_defaults.temperature", "must be a number"),
    ({"top_p": 0}, "sampling_defaults.top_p", "must be a number in (0, 1]"),
    ({"top_k": -2}, "sampling_defaults.top_k", "must be an integer >= 0"),
    ({"max_tokens": 0}, "sampling_defaults.max_tokens", "must be an integer >= 1"),
    ({"max_tokens": True}, "sampling_defaults.max_tokens", "must be an integer >= 1"),
    ({"seed": 3}, "sampling_defaults.seed", "is not a sampling default; allowed: temperature, top_p, top_k, "
                                            "max_tokens"),
])
def test_a_bad_default_is_400_naming_it_and_changes_nothing(operator_api, deployment, defaults, field, fragment):
    response = operator_api.patch("/api/v1/deployments/demo/", {"sampling_defaults": defaults}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field and fragment in error["message"]
    assert error["message"].startswith(field)
    assert Deployment.objects.get(pk=deployment.pk).sampling_defaults == {}
    assert not Action.objects.filter(kind="sampling").exists()


def test_a_bad_default_at_create_is_400_and_creates_nothing(admin_api, model_dir):
    response = admin_api.post("/api/v1/deployments/", {
        "name": "chat", "mode": "colocated", "model_path": str(model_dir),
        "sampling_defaults": {"top_p": 1.5}}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "sampling_defaults.top_p"
    assert not Deployment.objects.exists()


def test_an_unknown_patch_field_is_400(operator_api, deployment):
    response = operator_api.patch("/api/v1/deployments/demo/", {"mode": "colocated"}, format="json")
    assert response.status_code == 400
    assert "mode" in response.json()["error"]["message"]
