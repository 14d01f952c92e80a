"""Revisions with per-role engine settings through the API: only the deployment's roles, messages naming role and
key, common.dtype as the revision's dtype, and the diff by part."""
from __future__ import annotations

from controlplane.models import Action, Revision
from tests.procs import free_port


def _new_revision(api, body, name="demo"):
    return api.post(f"/api/v1/deployments/{name}/revisions/", body, format="json")


def test_a_revision_with_parts_per_role_is_stored_as_given(admin_api, deployment):
    response = _new_revision(admin_api, {"engine_settings": {
        "common": {"dtype": "bfloat16", "threads": 1}, "prefill": {"max_num_batched_tokens": 8192},
        "decode": {"max_num_seqs": 256}}})
    assert response.status_code == 202, response.content
    revision = response.json()["revision"]
    assert revision["dtype"] == "bfloat16"
    assert revision["engine_settings"] == {"common": {"threads": 1}, "prefill": {"max_num_batched_tokens": 8192},
                                           "decode": {"max_num_seqs": 256}}


def test_a_prefill_part_on_a_colocated_deployment_is_400_naming_it(admin_api, make_deployment):
    make_deployment("solo", mode="colocated")
    response = _new_revision(admin_api, {"engine_settings": {"prefill": {"max_num_seqs": 8}}}, name="solo")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["field"] == "engine_settings.prefill" and "prefill" in error["message"]
    assert Revision.objects.filter(deployment__name="solo").count() == 1
    assert not Action.objects.filter(kind="revision").exists()


def test_a_bad_per_role_value_at_create_is_400_and_creates_nothing(admin_api, model_dir):
    response = admin_api.post("/api/v1/deployments/", {
        "name": "chat", "mode": "disaggregated", "model_path": str(model_dir), "gateway_port": free_port(),
        "engine_settings": {"common": {"threads": 1}, "decode": {"max_num_seqs": -1}}}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("decode.max_num_seqs must be a positive integer")
    assert response.json()["error"]["field"] == "engine_settings.decode.max_num_seqs"
    assert not Revision.objects.exists()


def test_dtype_and_common_dtype_must_agree(admin_api, deployment):
    response = _new_revision(admin_api, {"dtype": "float32", "engine_settings": {"common": {"dtype": "bfloat16"}}})
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "engine_settings.common.dtype"
    # A role's own dtype is fine (the prefill worker converts its KV to the decode worker's).
    response = _new_revision(admin_api, {"engine_settings": {"decode": {"dtype": "bfloat16"}}})
    assert response.status_code == 202, response.content
    assert Revision.objects.get(deployment=deployment, number=2).engine_settings["decode"] == {"dtype": "bfloat16"}


def test_the_diff_shows_per_role_changes(admin_api, viewer_api, deployment):
    first = _new_revision(admin_api, {"engine_settings": {"common": {"threads": 1}, "decode": {"max_num_seqs": 64}}})
    Action.objects.filter(pk=first.json()["action"]["id"]).update(status="succeeded")
    second = _new_revision(admin_api, {"engine_settings": {"common": {"threads": 1},
                                                           "decode": {"max_num_seqs": 256}}})
    assert second.status_code == 202, second.content
    body = viewer_api.get("/api/v1/deployments/demo/revisions/diff").json()
    assert (body["from"], body["to"]) == (2, 3)
    assert body["changes"] == [{"field": "decode.max_num_seqs", "before": "64", "after": "256", "kind": "changed",
                                "text": "decode.max_num_seqs: 64 → 256"}]
    against_first = viewer_api.get("/api/v1/deployments/demo/revisions/diff?from=1&to=3").json()
    assert [change["text"] for change in against_first["changes"]] == [
        "common.threads: (not set) → 1", "decode.max_num_seqs: (not set) → 256"]


def test_the_diff_refuses_bad_and_unknown_revisions(viewer_api, deployment):
    assert viewer_api.get("/api/v1/deployments/demo/revisions/diff?from=x").status_code == 400
    first_only = viewer_api.get("/api/v1/deployments/demo/revisions/diff")
    assert first_only.status_code == 400 and first_only.json()["error"]["field"] == "from"
    assert viewer_api.get("/api/v1/deployments/demo/revisions/diff?from=1&to=9").status_code == 404
