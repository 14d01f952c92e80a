"""End to end: a revision's per-role engine settings reach the real worker processes (each says in /info the
max_num_seqs it runs with), and the deployment's sampling defaults reach its gateway, at create and after a PATCH.
Real web, Celery worker, node agent, workers and gateway."""
from __future__ import annotations

import pytest
import requests

from tests.procs import free_port

pytestmark = pytest.mark.integration

NAME = "it-per-role"


def _complete(gateway_url: str, **fields) -> requests.Response:
    return requests.post(f"{gateway_url}/v1/completions", timeout=30,
                         json={"model": NAME, "prompt": "Hello", "ignore_eos": True, **fields})


def test_each_role_runs_its_own_settings_and_the_gateway_applies_the_defaults(live, tiny_model_dir):
    gateway_port = free_port()
    created = live.api("POST", "deployments/", json={
        "name": NAME, "mode": "disaggregated", "model_path": str(tiny_model_dir),
        "engine_settings": {"common": {"threads": 1, "kv_cache_bytes": 8 << 20, "max_num_seqs": 16,
                                       "dtype": "float32"},
                            "prefill": {"max_num_batched_tokens": 1024},
                            "decode": {"max_num_seqs": 48}},
        "sampling_defaults": {"temperature": 0, "max_tokens": 5},
        "replicas": {"prefill": 1, "decode": 1}, "gateway_port": gateway_port,
    })
    assert created.status_code == 202, created.text
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    try:
        live.wait_for("the deployment to answer", lambda: _complete(gateway_url).status_code == 200, timeout=150,
                      interval=0.5)
        workers = {w["role"]: w for w in live.workers(NAME) if w["status"] == "ready" and w["role"] != "gateway"}
        infos = {role: requests.get(worker["url"] + "/info", timeout=10).json() for role, worker in workers.items()}
        assert (infos["prefill"]["max_num_seqs"], infos["prefill"]["max_num_batched_tokens"]) == (16, 1024)
        assert (infos["decode"]["max_num_seqs"], infos["decode"]["max_num_batched_tokens"]) == (48, 2048)
        assert infos["prefill"]["dtype"] == infos["decode"]["dtype"] == "float32"

        # The gateway polls the defaults: a request that leaves max_tokens out gets 5; its own value wins.
        assert _complete(gateway_url).json()["usage"]["completion_tokens"] == 5
        assert _complete(gateway_url, max_tokens=2).json()["usage"]["completion_tokens"] == 2
        (model,) = requests.get(gateway_url + "/v1/models", timeout=10).json()["data"]
        assert model["sampling_defaults"] == {"temperature": 0.0, "max_tokens": 5}

        patched = live.api("PATCH", f"deployments/{NAME}/", json={"sampling_defaults": {"max_tokens": 3}})
        assert patched.status_code == 200, patched.text
        assert patched.json()["action"]["kind"] == "sampling"
        live.wait_for("the gateway to apply the new defaults",
                      lambda: _complete(gateway_url).json()["usage"]["completion_tokens"] == 3, timeout=90)
    finally:
        deleted = live.api("DELETE", f"deployments/{NAME}/")
        assert deleted.status_code == 202, deleted.text
        action = deleted.json()["action"]
        live.wait_for("the delete to finish", lambda: live.action(action["id"])["status"] == "succeeded",
                      timeout=90)
