"""A deployment created through the API gets its workers and gateway started by the node agent, made ready by
health checks, and served through the gateway."""
from __future__ import annotations

import pytest

from tests.controlplane.integration.conftest import DEPLOYMENT, completion, wait_steady

pytestmark = [pytest.mark.integration, pytest.mark.backends]


def test_a_deployment_created_through_the_api_serves_completions_through_its_gateway(live, deployment):
    response = completion(deployment, prompt="The capital of France is", max_tokens=8)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == DEPLOYMENT and body["usage"]["completion_tokens"] == 8

    ready = wait_steady(live)
    assert all(w["pid"] and w["port"] and w["node"] == live.node_name and w["revision"] == 1 for w in ready)
    gateway, = [w for w in live.workers(DEPLOYMENT, role="gateway") if w["status"] == "ready"]
    assert gateway["port"] == int(deployment.rsplit(":", 1)[1])

    endpoints = live.api("GET", f"deployments/{DEPLOYMENT}/endpoints").json()
    assert endpoints["groups"] == [{"revision": 1, "colocated": [],
                                    "prefill": [w["url"] for w in ready if w["role"] == "prefill"],
                                    "decode": [w["url"] for w in ready if w["role"] == "decode"],
                                    "weights": {w["url"]: 1 for w in ready}}]
    create, = live.actions(DEPLOYMENT, kind="create")
    assert create["actor"] == "it-admin"


def test_the_node_agent_registered_its_node_with_no_gpus_on_this_host(live, deployment):
    node = live.api("GET", f"nodes/{live.node_name}/").json()
    assert node["online"] is True and node["gpus"] == [] and node["queue"] == f"node.{live.node_name}"
