"""Deployments: create, list, detail, delete; revisions: list, create."""
from __future__ import annotations

import pytest

from controlplane.models import Action, Deployment, Pool, Revision
from tests.procs import free_port

pytestmark = pytest.mark.django_db


def create(client, model_dir, **fields):
    body = {"name": "chat", "mode": "disaggregated", "model_path": str(model_dir), **fields}
    return client.post("/api/v1/deployments/", body, format="json")


def test_create_makes_revision_one_its_pools_and_a_create_action(admin_api, model_dir):
    port = free_port()
    response = create(admin_api, model_dir, dtype="bfloat16", engine_settings={"threads": 2, "kv_cache_bytes": 1 << 26},
                      replicas={"prefill": 1, "decode": 2}, max_replicas={"decode": 4}, gateway_port=port)
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["action"]["kind"] == "create" and body["action"]["status"] == "pending"
    assert body["deployment"]["name"] == "chat"
    assert body["deployment"]["current_revision"] == 1
    assert body["deployment"]["gateway_port"] == port
    assert body["deployment"]["gateway_url"] == f"http://127.0.0.1:{port}"
    pools = {p["role"]: p for p in body["deployment"]["pools"]}
    assert pools["decode"] == {"role": "decode", "desired_replicas": 2, "min_replicas": 1, "max_replicas": 4,
                               "ready_replicas": 0, "status": "ok", "unschedulable_reason": "",
                               "node_selector": {}, "gpus_per_worker": 0, "threads_per_worker": 0,
                               "allow_gpu_sharing": False, "routing_weights": []}
    assert pools["prefill"]["desired_replicas"] == 1 and pools["prefill"]["max_replicas"] == 8
    revision = Revision.objects.get(deployment__name="chat")
    assert (revision.number, revision.dtype, revision.engine_settings) == (
        1, "bfloat16", {"common": {"threads": 2, "kv_cache_bytes": 1 << 26}})  # a flat dict is read as common
    assert revision.model_path == str(model_dir.resolve())


def test_the_dtype_defaults_to_auto_the_model_configs_own(admin_api, model_dir):
    assert create(admin_api, model_dir).status_code == 202
    assert Revision.objects.get(deployment__name="chat").dtype == "auto"
    response = create(admin_api, model_dir, name="bad", dtype="int4")
    assert response.status_code == 400 and "dtype" in response.content.decode()


def test_a_colocated_deployment_has_one_colocated_pool(admin_api, model_dir):
    response = create(admin_api, model_dir, mode="colocated")
    assert response.status_code == 202
    assert [p["role"] for p in response.json()["deployment"]["pools"]] == ["colocated"]


def test_create_picks_the_first_free_gateway_port_not_used_by_another_deployment(admin_api, model_dir, settings):
    base = free_port()
    settings.TANDEM_GATEWAY_PORT = base
    first = create(admin_api, model_dir, name="one").json()["deployment"]["gateway_port"]
    second = create(admin_api, model_dir, name="two").json()["deployment"]["gateway_port"]
    assert first >= base and second > first


def test_a_taken_name_is_409(admin_api, model_dir, deployment):
    response = create(admin_api, model_dir, name="demo")
    assert response.status_code == 409
    assert "'demo' already exists" in response.json()["error"]["message"]


def test_a_taken_gateway_port_is_409(admin_api, model_dir, deployment):
    response = create(admin_api, model_dir, gateway_port=deployment.gateway_port)
    assert response.status_code == 409
    assert "used by another deployment" in response.json()["error"]["message"]


@pytest.mark.parametrize("name", ["Demo", "-x", "a_b", "", "x" * 64, "a b"])
def test_a_name_that_is_not_a_slug_is_400(admin_api, model_dir, name):
    response = create(admin_api, model_dir, name=name)
    assert response.status_code == 400
    assert response.json()["error"].get("field") == "name" or "name" in response.json()["error"].get("fields", {})


def test_a_model_path_that_does_not_exist_is_400(admin_api, tmp_path):
    response = create(admin_api, tmp_path / "missing")
    assert response.status_code == 400
    assert "is not an existing folder" in response.json()["error"]["message"]


def test_a_model_folder_without_config_json_is_400(admin_api, tmp_path):
    response = create(admin_api, tmp_path)
    assert response.status_code == 400
    assert "no config.json" in response.json()["error"]["message"]


@pytest.mark.parametrize("engine_settings,fragment", [
    ({"kv_cache_bytes": 0}, "common.kv_cache_bytes must be a positive integer or auto"),
    ({"kv_cache_bytes": "64MB"}, "common.kv_cache_bytes must be a positive integer or auto"),
    ({"threads": True}, "common.threads must be a positive integer"),
    ({"device": "tpu"}, "common.device"),
    ({"colour": "blue"}, "common.colour is not an engine setting; allowed: "),
    ({"decode": {"max_num_seqs": 0}}, "decode.max_num_seqs must be a positive integer"),
    ({"prefill": {"max_num_seq": 8}}, "prefill.max_num_seq is not an engine setting; allowed: "),
    ({"common": {"dtype": "bfloat16", "kv_cache_dtype": "float16"}},
     "common.kv_cache_dtype float16 does not suit the revision's dtype bfloat16"),
])
def test_bad_engine_settings_are_400_naming_the_key(admin_api, model_dir, engine_settings, fragment):
    response = create(admin_api, model_dir, engine_settings=engine_settings)
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]
    assert not Deployment.objects.exists()


def test_replicas_outside_their_bounds_are_400(admin_api, model_dir):
    response = create(admin_api, model_dir, replicas={"decode": 5}, max_replicas={"decode": 4})
    assert response.status_code == 400
    assert "between 1 and 4" in response.json()["error"]["message"]


def test_replicas_for_a_role_of_another_mode_are_400(admin_api, model_dir):
    response = create(admin_api, model_dir, mode="colocated", replicas={"decode": 1})
    assert response.status_code == 400
    assert "names roles ['decode']" in response.json()["error"]["message"]


def test_list_and_detail_show_pools_with_ready_counts(viewer_api, deployment, make_worker):
    make_worker(deployment, "decode", status="ready")
    make_worker(deployment, "decode", status="starting")
    listed = viewer_api.get("/api/v1/deployments/").json()
    assert [d["name"] for d in listed] == ["demo"]
    detail = viewer_api.get("/api/v1/deployments/demo/").json()
    assert [p["role"] for p in detail["pools"]] == ["prefill", "decode"]
    assert {p["role"]: p["ready_replicas"] for p in detail["pools"]} == {"prefill": 0, "decode": 1}
    assert viewer_api.get("/api/v1/deployments/nope/").status_code == 404


def test_delete_sets_pools_to_zero_and_records_a_pending_delete(admin_api, deployment):
    response = admin_api.delete("/api/v1/deployments/demo/")
    assert response.status_code == 202
    assert response.json()["action"]["kind"] == "delete"
    assert response.json()["deployment"]["deleting"] is True
    assert set(Pool.objects.filter(deployment=deployment).values_list("desired_replicas", flat=True)) == {0}
    again = admin_api.delete("/api/v1/deployments/demo/")
    assert again.json()["action"]["id"] == response.json()["action"]["id"]
    assert Action.objects.filter(kind="delete").count() == 1


def test_a_deployment_being_deleted_refuses_scaling(admin_api, operator_api, deployment):
    admin_api.delete("/api/v1/deployments/demo/")
    response = operator_api.post("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 2}, format="json")
    assert response.status_code == 409
    assert "being deleted" in response.json()["error"]["message"]


def test_revisions_list_newest_first_and_mark_the_current_one(viewer_api, deployment, second_revision):
    revisions = viewer_api.get("/api/v1/deployments/demo/revisions/").json()
    assert [(r["number"], r["is_current"]) for r in revisions] == [(2, True), (1, False)]
    assert revisions[0]["engine_settings"] == {"common": {"threads": 2}}


def test_creating_a_revision_copies_what_is_not_given_and_makes_it_current(admin_api, deployment):
    response = admin_api.post("/api/v1/deployments/demo/revisions/",
                              {"engine_settings": {"max_num_seqs": 8}, "comment": "fewer seqs"}, format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["action"]["kind"] == "revision" and body["action"]["status"] == "running"
    assert body["revision"]["number"] == 2 and body["revision"]["is_current"] is True
    assert body["revision"]["engine_settings"] == {"common": {"max_num_seqs": 8}}
    assert body["revision"]["model_path"] == deployment.current_revision.model_path
    assert Deployment.objects.get(pk=deployment.pk).current_revision.number == 2


def test_a_new_revision_while_a_rollout_runs_is_409(admin_api, deployment):
    assert admin_api.post("/api/v1/deployments/demo/revisions/", {}, format="json").status_code == 202
    response = admin_api.post("/api/v1/deployments/demo/revisions/", {}, format="json")
    assert response.status_code == 409
