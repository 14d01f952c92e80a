"""A pool's routing_weights through the API: admins set them with the pool PATCH or at creation (`placement`), each
change is a `placement` audit row with the old and new values, and bad input is a 400 naming the entry that changes
nothing. A node's `tandem.weight` label must be a weight too."""
from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.models import Action, Deployment, Node, Pool

pytestmark = pytest.mark.django_db

COMPUTE_3 = [{"selector": {"class": "compute"}, "weight": 3}, {"selector": {}, "weight": 0.5}]


def test_admins_set_a_pools_routing_weights_and_the_change_is_audited(admin_api, viewer_api, admin, deployment):
    response = admin_api.patch("/api/v1/deployments/demo/pools/decode",
                               {"routing_weights": COMPUTE_3, "reason": "compute nodes take more"}, format="json")
    assert response.status_code == 200, response.content
    decode, = [p for p in response.json()["deployment"]["pools"] if p["role"] == "decode"]
    assert decode["routing_weights"] == COMPUTE_3
    audit = Action.objects.get(kind="placement")
    assert audit.reason == "compute nodes take more" and audit.actor == admin.username
    assert (audit.params["role"], audit.params["from"]["routing_weights"], audit.params["to"]["routing_weights"]) \
        == ("decode", [], COMPUTE_3)
    # Only routing_weights changed: the rest of the placement is as it was.
    assert audit.params["from"]["node_selector"] == audit.params["to"]["node_selector"] == {}
    pools = {p["role"]: p for p in viewer_api.get("/api/v1/deployments/demo/").json()["pools"]}
    assert pools["decode"]["routing_weights"] == COMPUTE_3 and pools["prefill"]["routing_weights"] == []


@pytest.mark.parametrize("routing_weights,field,message", [
    ({"class": "compute"}, "routing_weights", "routing_weights must be a list"),
    ([3], "routing_weights[0]", "routing_weights[0] must be an object"),
    ([{"selector": {"class": "compute"}}], "routing_weights[0]",
     "routing_weights[0] must have exactly the keys selector and weight, not ['selector']"),
    ([{"selector": {}, "weight": 1, "extra": 1}], "routing_weights[0]", "exactly the keys selector and weight"),
    ([{"selector": {}, "weight": 2}, {"selector": {"class": "compute"}, "weight": 0}], "routing_weights[1].weight",
     "routing_weights[1].weight must be above 0 and at most 100, not 0"),
    ([{"selector": {}, "weight": 101}], "routing_weights[0].weight", "at most 100, not 101"),
    ([{"selector": {}, "weight": -2}], "routing_weights[0].weight", "must be above 0"),
    ([{"selector": {}, "weight": "3"}], "routing_weights[0].weight", "must be a number, not '3'"),
    ([{"selector": {}, "weight": True}], "routing_weights[0].weight", "must be a number, not True"),
    ([{"selector": "class=compute", "weight": 3}], "routing_weights[0].selector",
     "routing_weights[0].selector must be an object"),
    ([{"selector": {"Class": "compute"}, "weight": 3}], "routing_weights[0].selector.Class", "is not a label name"),
    ([{"selector": {}, "weight": 1}] * 17, "routing_weights", "at most 16 entries, not 17"),
])
def test_bad_routing_weights_are_a_400_naming_the_entry_and_change_nothing(admin_api, deployment, routing_weights,
                                                                          field, message):
    response = admin_api.patch("/api/v1/deployments/demo/pools/decode",
                               {"routing_weights": routing_weights, "gpus_per_worker": 1}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field and message in error["message"]
    pool = Pool.objects.get(deployment=deployment, role="decode")
    assert (pool.routing_weights, pool.gpus_per_worker) == ([], 0)  # the valid part was not applied either
    assert not Action.objects.filter(kind="placement").exists()


def test_operators_cannot_change_routing_weights(operator_api, deployment):
    response = operator_api.patch("/api/v1/deployments/demo/pools/decode", {"routing_weights": COMPUTE_3},
                                  format="json")
    assert response.status_code == 403


def test_routing_weights_can_be_given_when_the_deployment_is_created(admin_api, model_dir):
    response = admin_api.post("/api/v1/deployments/", {
        "name": "weighted", "mode": "disaggregated", "model_path": str(model_dir),
        "placement": {"decode": {"routing_weights": COMPUTE_3}}}, format="json")
    assert response.status_code == 202, response.content
    pools = {p["role"]: p for p in response.json()["deployment"]["pools"]}
    assert pools["decode"]["routing_weights"] == COMPUTE_3 and pools["prefill"]["routing_weights"] == []


def test_a_bad_weight_at_creation_names_the_role_and_creates_nothing(admin_api, model_dir):
    response = admin_api.post("/api/v1/deployments/", {
        "name": "weighted", "mode": "disaggregated", "model_path": str(model_dir),
        "placement": {"prefill": {"routing_weights": [{"selector": {}, "weight": 1000}]}}}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == "placement.prefill.routing_weights[0].weight"
    assert "placement.prefill.routing_weights[0].weight must be above 0 and at most 100" in error["message"]
    assert not Deployment.objects.filter(name="weighted").exists()


@pytest.fixture
def gpu_node(db):
    return Node.objects.create(name="gpu-01", last_seen_at=timezone.now(), detected_labels={"gpu.count": "1"})


@pytest.mark.parametrize("value", ["0", "fast", "250", "1e3"])
def test_a_node_weight_label_that_is_not_a_weight_is_a_400(admin_api, gpu_node, value):
    response = admin_api.patch("/api/v1/nodes/gpu-01/", {"labels": {"tandem.weight": value}}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == "labels.tandem.weight" and "(a routing weight)" in error["message"]
    gpu_node.refresh_from_db()
    assert gpu_node.labels == {}


def test_a_node_weight_label_is_accepted(admin_api, gpu_node):
    response = admin_api.patch("/api/v1/nodes/gpu-01/", {"labels": {"tandem.weight": "2.5"}}, format="json")
    assert response.status_code == 200, response.content
    gpu_node.refresh_from_db()
    assert gpu_node.labels == {"tandem.weight": "2.5"}
