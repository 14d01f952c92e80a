"""Two node agents with different labels stand in for two hosts: a disaggregated deployment whose prefill pool
selects class=compute and decode pool class=bandwidth gets each pool's worker on its own node, and a pool asking
for a GPU that no node has is reported unschedulable (API status, reason, audit row) while the rest keeps serving."""
from __future__ import annotations

import pytest

from tests.controlplane.integration.conftest import completion
from tests.procs import free_port

pytestmark = pytest.mark.integration
NAME = "it-placed"


def test_each_pool_runs_on_the_nodes_its_selector_names(live, deployment, tiny_model_dir, second_node):
    gateway_port = free_port()
    created = live.api("POST", "deployments/", json={
        "name": NAME, "mode": "disaggregated", "model_path": str(tiny_model_dir), "dtype": "float32",
        "engine_settings": {"threads": 1, "kv_cache_bytes": 8 << 20}, "gateway_port": gateway_port,
        "placement": {"prefill": {"node_selector": {"class": "compute"}},
                      "decode": {"node_selector": {"class": "bandwidth"}}}})
    assert created.status_code == 202, created.text
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    try:
        live.wait_for("the placed deployment to answer", lambda: _answers(gateway_url), timeout=180, interval=0.5)
        nodes = {w["role"]: w["node"] for w in live.workers(NAME) if w["status"] == "ready"}
        assert nodes["prefill"] == live.node_name and nodes["decode"] == second_node

        # A GPU per decode worker: neither node has one. Desired state is accepted and reported, never silent.
        placed = live.api("PATCH", f"deployments/{NAME}/pools/decode", json={"gpus_per_worker": 1})
        assert placed.ok, placed.text
        assert live.api("POST", f"deployments/{NAME}/scale", json={"role": "decode", "replicas": 2}).ok

        def unschedulable():
            pools = {p["role"]: p for p in live.api("GET", f"deployments/{NAME}/").json()["pools"]}
            return pools["decode"] if pools["decode"]["status"] == "unschedulable" else None

        decode = live.wait_for("the decode pool to say it is unschedulable", unschedulable, timeout=60)
        assert decode["unschedulable_reason"] == ("1 of 2 workers cannot be placed: no online node matches "
                                                  "class=bandwidth with 1 free GPU")
        assert [a for a in live.actions(NAME, kind="unschedulable") if a["params"]["role"] == "decode"]
        assert _answers(gateway_url)  # the placed worker keeps serving
    finally:
        deleted = live.api("DELETE", f"deployments/{NAME}/")
        if deleted.status_code == 202:
            live.wait_for("the placed deployment to be deleted",
                          lambda: live.api("GET", f"deployments/{NAME}/").status_code == 404, timeout=90)
    assert completion(deployment).status_code == 200  # the session's deployment never noticed


def _answers(gateway_url: str) -> bool:
    import requests

    try:
        return requests.post(f"{gateway_url}/v1/completions", timeout=30, json={
            "model": NAME, "prompt": "Hello", "max_tokens": 4, "temperature": 0}).status_code == 200
    except requests.RequestException:
        return False
