"""Deleting a deployment stops its worker and gateway processes, then removes it; the audit log stays."""
from __future__ import annotations

import psutil
import pytest

from tests.controlplane.integration.conftest import completion
from tests.procs import free_port

pytestmark = [pytest.mark.integration, pytest.mark.backends]


def test_deleting_a_colocated_deployment_stops_its_processes_and_keeps_its_actions(live, deployment,
                                                                                  tiny_model_dir):
    gateway_port = free_port()
    created = live.api("POST", "deployments/", json={
        "name": "it-colocated", "mode": "colocated", "model_path": str(tiny_model_dir),
        "engine_settings": {"threads": 1, "kv_cache_bytes": 8 << 20}, "replicas": {"colocated": 1},
        "gateway_port": gateway_port,
    })
    assert created.status_code == 202, created.text
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    live.wait_for("the colocated deployment to answer", lambda: _answers(gateway_url), timeout=180, interval=0.5)
    # The gateway's row reads ready from the next health pass after it answers.
    pids = live.wait_for("the colocated worker and the gateway ready", lambda: (
        p := [w["pid"] for w in live.workers("it-colocated") if w["status"] == "ready"]) and len(p) == 2 and p)

    deleted = live.api("DELETE", "deployments/it-colocated/")
    assert deleted.status_code == 202, deleted.text
    action = deleted.json()["action"]
    live.wait_for("the delete action to succeed", lambda: live.action(action["id"])["status"] == "succeeded",
                  timeout=60)
    assert live.api("GET", "deployments/it-colocated/").status_code == 404
    assert not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE for pid in pids)
    kinds = {a["kind"] for a in live.actions("it-colocated")}
    assert {"create", "delete"} <= kinds
    assert completion(deployment).status_code == 200  # the other deployment never noticed


def _answers(gateway_url: str) -> bool:
    import requests

    response = requests.post(f"{gateway_url}/v1/completions", timeout=10,
                             json={"model": "it-colocated", "prompt": "Hello", "max_tokens": 4})
    return response.status_code == 200
