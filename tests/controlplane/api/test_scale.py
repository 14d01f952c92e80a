"""POST /api/v1/deployments/{name}/scale."""
from __future__ import annotations

import pytest

from controlplane.models import Action, Pool

pytestmark = pytest.mark.django_db


def scale(client, body, name="demo"):
    return client.post(f"/api/v1/deployments/{name}/scale", body, format="json")


def test_it_sets_desired_replicas_and_answers_202_with_the_action(operator_api, deployment):
    response = scale(operator_api, {"role": "decode", "replicas": 3, "reason": "more load"})
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["action"]["kind"] == "scale"
    assert body["action"]["status"] == "pending"
    assert body["action"]["actor"] == "otto-operator"
    assert body["action"]["actor_type"] == "user"
    assert body["action"]["reason"] == "more load"
    assert body["action"]["params"] == {"role": "decode", "from": 1, "to": 3}
    decode = {p["role"]: p for p in body["deployment"]["pools"]}["decode"]
    assert decode["desired_replicas"] == 3
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 3
    assert Pool.objects.get(deployment=deployment, role="prefill").desired_replicas == 1


def test_it_refuses_scale_above_max_replicas_and_says_the_bounds(operator_api, deployment):
    response = scale(operator_api, {"role": "decode", "replicas": 9})
    assert response.status_code == 400
    error = response.json()["error"]
    assert "between 1 and 8" in error["message"]
    assert (error["min_replicas"], error["max_replicas"]) == (1, 8)
    assert error["field"] == "replicas"
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 1
    assert not Action.objects.filter(kind="scale").exists()


def test_it_refuses_scale_below_min_replicas(operator_api, deployment):
    response = scale(operator_api, {"role": "prefill", "replicas": 0})
    assert response.status_code == 400
    assert "between 1 and 8" in response.json()["error"]["message"]


def test_it_refuses_a_role_the_deployment_has_no_pool_for(operator_api, deployment):
    response = scale(operator_api, {"role": "colocated", "replicas": 1})
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert "no 'colocated' pool" in message and "decode" in message and "prefill" in message


def test_it_refuses_a_role_that_does_not_exist(operator_api, deployment):
    response = scale(operator_api, {"role": "verifier", "replicas": 1})
    assert response.status_code == 400
    assert "role" in response.json()["error"]["fields"]


def test_it_answers_404_for_an_unknown_deployment(operator_api, deployment):
    response = scale(operator_api, {"role": "decode", "replicas": 2}, name="nope")
    assert response.status_code == 404
    assert "'nope' does not exist" in response.json()["error"]["message"]


def test_a_repeated_idempotency_key_scales_once(operator_api, deployment):
    first = scale(operator_api, {"role": "decode", "replicas": 2, "idempotency_key": "k-1"}).json()["action"]
    again = scale(operator_api, {"role": "decode", "replicas": 2, "idempotency_key": "k-1"}).json()["action"]
    assert again["id"] == first["id"]
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 2
    assert Action.objects.filter(kind="scale").count() == 1


def test_the_same_key_with_another_body_is_a_422_naming_the_earlier_action(operator_api, deployment):
    first = scale(operator_api, {"role": "decode", "replicas": 2, "idempotency_key": "k-1"}).json()["action"]
    response = scale(operator_api, {"role": "decode", "replicas": 5, "idempotency_key": "k-1"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "idempotency_key_reused" and error["action_id"] == first["id"]
    assert "already used for a different request" in error["message"]
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 2


def test_the_idempotency_key_header_works_too(operator_api, deployment):
    first = scale(operator_api, {"role": "decode", "replicas": 2}, ).json()["action"]
    keyed = operator_api.post("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 3}, format="json",
                              HTTP_IDEMPOTENCY_KEY="hdr-1").json()["action"]
    again = operator_api.post("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 3}, format="json",
                              HTTP_IDEMPOTENCY_KEY="hdr-1").json()["action"]
    assert keyed["id"] == again["id"] != first["id"]
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 3


def test_idempotency_keys_are_per_user(operator_api, admin_api, deployment):
    """An admin reusing an operator's key gets an action of its own, not the operator's."""
    mine = scale(operator_api, {"role": "decode", "replicas": 2, "idempotency_key": "k-1"}).json()["action"]
    theirs = scale(admin_api, {"role": "decode", "replicas": 3, "idempotency_key": "k-1"})
    assert theirs.status_code == 202, theirs.content
    theirs = theirs.json()["action"]
    assert theirs["id"] != mine["id"] and theirs["actor"] != mine["actor"]
    assert mine["idempotency_key"] == theirs["idempotency_key"] == "k-1"  # as each client sent it
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 3


def test_a_header_key_that_differs_from_the_bodys_is_a_400_and_changes_nothing(operator_api, deployment):
    response = operator_api.post("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 3,
                                                                    "idempotency_key": "body-1"},
                                 format="json", HTTP_IDEMPOTENCY_KEY="header-1")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == "idempotency_key" and "'header-1'" in error["message"] and "'body-1'" in error["message"]
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 1
    assert not Action.objects.filter(kind="scale").exists()


def test_it_enqueues_a_reconcile_after_commit(operator_api, deployment, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert scale(operator_api, {"role": "decode", "replicas": 2}).status_code == 202
    assert len(callbacks) == 1


def test_a_refused_scale_enqueues_nothing(operator_api, deployment, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        assert scale(operator_api, {"role": "decode", "replicas": 99}).status_code == 400
    assert callbacks == []


def test_the_trailing_slash_form_works(operator_api, deployment):
    response = operator_api.post("/api/v1/deployments/demo/scale/", {"role": "decode", "replicas": 2}, format="json")
    assert response.status_code == 202
