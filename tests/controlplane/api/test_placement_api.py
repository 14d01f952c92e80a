"""Labels and placement through the API: admins set node labels and a pool's selector and per-worker request;
the deployment shows each pool's status, `unschedulable` with its reason when nothing fits; bad input is a 400
naming the field."""
from __future__ import annotations

import pytest
from django.utils import timezone

from controlplane.models import Action, Node
from tests.controlplane.supervision.conftest import reconcile  # noqa: F401  (shared fixture)

pytestmark = pytest.mark.django_db


@pytest.fixture
def gpu_node(db):
    return Node.objects.create(name="gpu-01", last_seen_at=timezone.now(),
                               gpus=[{"index": 0, "name": "NVIDIA H200", "memory_total_bytes": 141 << 30}],
                               detected_labels={"gpu.count": "1", "gpu.model": "NVIDIA H200", "cpu.count": "16"})


def test_admins_label_a_node_and_everyone_sees_detected_and_set_labels(admin_api, viewer_api, gpu_node):
    assert viewer_api.patch("/api/v1/nodes/gpu-01/", {"labels": {"class": "bandwidth"}},
                            format="json").status_code == 403
    response = admin_api.patch("/api/v1/nodes/gpu-01/", {"labels": {"class": "bandwidth"}}, format="json")
    assert response.status_code == 200, response.content
    node = viewer_api.get("/api/v1/nodes/gpu-01/").json()
    assert node["labels"] == {"class": "bandwidth"}
    assert node["all_labels"] == {"gpu.count": "1", "gpu.model": "NVIDIA H200", "cpu.count": "16",
                                  "class": "bandwidth"}
    audit = Action.objects.get(kind="label")
    assert audit.params == {"node": "gpu-01", "from": {}, "to": {"class": "bandwidth"}}


@pytest.mark.parametrize("labels,field", [({"Class": "x"}, "labels.Class"), ({"class": "a" * 70}, "labels.class"),
                                          ({"class": "two words!"}, "labels.class")])
def test_a_bad_label_is_a_400_naming_it(admin_api, gpu_node, labels, field):
    response = admin_api.patch("/api/v1/nodes/gpu-01/", {"labels": labels}, format="json")
    assert response.status_code == 400 and response.json()["error"]["field"] == field


def test_a_pool_that_cannot_be_placed_says_so_in_the_deployment(admin_api, viewer_api, deployment, gpu_node,
                                                                 reconcile, sent):
    response = admin_api.patch("/api/v1/deployments/demo/pools/decode",
                               {"node_selector": {"class": "bandwidth"}, "gpus_per_worker": 1}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["action"]["kind"] == "placement"
    reconcile(deployment)
    decode, = [p for p in viewer_api.get("/api/v1/deployments/demo/").json()["pools"] if p["role"] == "decode"]
    assert decode["status"] == "unschedulable"
    assert decode["unschedulable_reason"] == ("1 of 1 workers cannot be placed: no online node matches "
                                              "class=bandwidth")
    admin_api.patch("/api/v1/nodes/gpu-01/", {"labels": {"class": "bandwidth"}}, format="json")
    reconcile(deployment)
    decode, = [p for p in viewer_api.get("/api/v1/deployments/demo/").json()["pools"] if p["role"] == "decode"]
    assert decode["status"] == "ok" and decode["node_selector"] == {"class": "bandwidth"}


@pytest.mark.parametrize("body,field", [({"gpus_per_worker": -1}, "gpus_per_worker"),
                                        ({"node_selector": {"": "x"}}, "node_selector."),
                                        ({"allow_gpu_sharing": "maybe"}, "allow_gpu_sharing")])
def test_bad_placement_input_is_a_400(admin_api, deployment, body, field):
    response = admin_api.patch("/api/v1/deployments/demo/pools/decode", body, format="json")
    assert response.status_code == 400, response.content
    assert field in str(response.json()["error"])


def test_operators_cannot_change_placement(operator_api, deployment):
    response = operator_api.patch("/api/v1/deployments/demo/pools/decode", {"gpus_per_worker": 1}, format="json")
    assert response.status_code == 403


def test_placement_can_be_given_when_the_deployment_is_created(admin_api, model_dir):
    response = admin_api.post("/api/v1/deployments/", {
        "name": "placed", "mode": "disaggregated", "model_path": str(model_dir),
        "placement": {"decode": {"node_selector": {"class": "bandwidth"}, "gpus_per_worker": 1}}}, format="json")
    assert response.status_code == 202, response.content
    pools = {p["role"]: p for p in response.json()["deployment"]["pools"]}
    assert pools["decode"]["node_selector"] == {"class": "bandwidth"} and pools["decode"]["gpus_per_worker"] == 1
    assert pools["prefill"]["node_selector"] == {}


@pytest.mark.parametrize("placement,message", [
    ({"colocated": {}}, "placement names roles ['colocated']"),
    ({"decode": {"gpus": 1}}, "unknown placement fields ['gpus']"),
])
def test_bad_placement_at_creation_is_a_400_and_creates_nothing(admin_api, model_dir, placement, message):
    response = admin_api.post("/api/v1/deployments/", {"name": "placed", "mode": "disaggregated",
                                                       "model_path": str(model_dir), "placement": placement},
                              format="json")
    assert response.status_code == 400 and message in response.json()["error"]["message"]
    assert admin_api.get("/api/v1/deployments/placed/").status_code == 404
