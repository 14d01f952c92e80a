"""A deployment whose revision runs vLLM: created with vLLM's settings, refused with a 400 naming the field for what
vLLM cannot take (a Tandem-only setting, a context longer than the model's, a disaggregated pair), and served to its
gateway as a vLLM group (engine, admission slots, prefix caching), while Tandem groups stay as they were."""
from __future__ import annotations

import json

import pytest

from controlplane.models import Deployment, Revision
from controlplane.selectors import deployment_endpoints
from tests.procs import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def vllm_model(model_dir):
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 1024}))
    return model_dir


def create(client, model_dir, engine_settings, mode="colocated", name="chat-vllm"):
    return client.post("/api/v1/deployments/", {
        "name": name, "mode": mode, "model_path": str(model_dir), "engine_settings": engine_settings,
        "replicas": {"colocated": 1} if mode == "colocated" else {"prefill": 1, "decode": 1},
        "gateway_port": free_port()}, format="json")


def test_a_vllm_revision_is_stored_with_its_settings(admin_api, vllm_model):
    response = create(admin_api, vllm_model, {"engine": "vllm", "max_num_seqs": 32, "compile": False,
                                              "prefix_caching": False, "max_model_len": 1024})
    assert response.status_code == 202, response.content
    revision = Revision.objects.get(deployment__name="chat-vllm")
    assert revision.engine_settings == {"common": {"engine": "vllm", "max_num_seqs": 32, "compile": False,
                                                   "prefix_caching": False, "max_model_len": 1024}}


@pytest.mark.parametrize("settings, mode, field, words", [
    ({"engine": "vllm", "interleave_prefill": False}, "colocated", "engine_settings.common.interleave_prefill",
     "has no meaning for a vLLM worker"),
    ({"engine": "vllm", "max_model_len": 4096}, "colocated", "engine_settings.common.max_model_len",
     "longer than the model's context of 1024"),
    ({"engine": "vllm"}, "disaggregated", "engine_settings.common.engine", "serves colocated deployments"),
    ({"engine": "sglang"}, "colocated", "engine_settings.common.engine", "not one of tandem, vllm"),
    ({"common": {"engine": "vllm"}, "colocated": {"engine": "vllm"}}, "colocated",
     "engine_settings.colocated.engine", "belongs in common"),
    ({"engine": "vllm", "extra_args": ["--host", "0.0.0.0"]}, "colocated", "engine_settings.common.extra_args",
     "which Tandem sets itself"),
])
def test_what_vllm_cannot_take_is_a_400_naming_the_field_and_creates_nothing(admin_api, vllm_model, settings,
                                                                              mode, field, words):
    response = create(admin_api, vllm_model, settings, mode=mode)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field and words in error["message"], error
    assert not Deployment.objects.filter(name="chat-vllm").exists()


def test_a_vllm_group_tells_the_gateway_its_engine_slots_and_prefix_caching(admin_api, vllm_model, make_worker):
    assert create(admin_api, vllm_model, {"engine": "vllm", "max_num_seqs": 12}).status_code == 202
    deployment = Deployment.objects.get(name="chat-vllm")
    make_worker(deployment, "colocated", port=41555)
    group, = deployment_endpoints(deployment)["groups"]
    assert (group["engine"], group["max_num_seqs"], group["prefix_caching"]) == ("vllm", 12, True)
    assert group["colocated"] == ["http://127.0.0.1:41555"]


def test_a_tandem_group_says_nothing_of_engines(deployment, make_worker):
    make_worker(deployment, "decode")
    make_worker(deployment, "prefill")
    group, = deployment_endpoints(deployment)["groups"]
    assert "engine" not in group and "max_num_seqs" not in group
