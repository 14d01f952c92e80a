"""The node agent starts a vLLM worker with vLLM's OpenAI server from TANDEM_VLLM_PYTHON: the revision's settings
as vLLM's flags, the deployment's name as the served model, the revision's worker secret as its API key in the
environment (never on the command line), its share of the host's KV memory in whole GiB, half the stop deadline
as vLLM's shutdown timeout (its engine core takes seconds more to stop); and where the host has no vLLM, the start fails with that reason."""
from __future__ import annotations

import pytest

from controlplane.agent import launch
from controlplane.models import Worker
from controlplane.services import action_succeed, revision_create
from inference.worker_secret import SECRET_ENV

pytestmark = pytest.mark.django_db


@pytest.fixture
def vllm_revision(deployment, admin):
    deployment.mode = "colocated"
    deployment.save(update_fields=["mode"])
    action = revision_create(deployment=deployment, actor=admin, dtype="float32", engine_settings={
        "engine": "vllm", "max_num_seqs": 8, "compile": False, "threads": 2}, comment="vllm")
    action_succeed(action_id=action.pk)
    deployment.refresh_from_db()
    return deployment.current_revision


def test_a_vllm_worker_runs_vllms_server_with_the_revisions_settings(deployment, online_node, vllm_revision,
                                                                    settings):
    settings.TANDEM_VLLM_PYTHON = "/opt/vllm/bin/python"
    settings.TANDEM_STOP_DEADLINE_S = 10
    worker = Worker(deployment=deployment, role="colocated", node=online_node, id=71, revision=vllm_revision,
                    host="127.0.0.1")
    argv = launch.argv_for(worker, 8123)
    env = launch.env_for(worker)
    assert argv[:12] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model",
                         vllm_revision.model_path, "--served-model-name", "demo", "--host", "127.0.0.1", "--port",
                         "8123", "--dtype"]
    assert argv[12:] == ["float32", "--max-num-seqs", "8", "--shutdown-timeout", "5", "--enforce-eager"]
    assert env["VLLM_API_KEY"] and env["VLLM_API_KEY"] not in " ".join(argv) and SECRET_ENV not in env
    assert env["OMP_NUM_THREADS"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert int(env["VLLM_CPU_KVCACHE_SPACE"]) >= 1  # the worker's share of TANDEM_KV_HOST_PERCENT, in GiB


def test_a_host_without_vllm_fails_the_start_with_the_reason(deployment, online_node, vllm_revision, settings):
    settings.TANDEM_VLLM_PYTHON = ""
    worker = Worker(deployment=deployment, role="colocated", node=online_node, id=72, revision=vllm_revision)
    with pytest.raises(ValueError, match="this node has no vLLM to run the worker with: set TANDEM_VLLM_PYTHON"):
        launch.argv_for(worker, 8124)
