"""A simulated fleet (`manage.py tandem_simfleet`) under a real control plane: real Celery, database and gateway
membership; only the forward pass is replaced. Workers of a revision with `simulate` start on the simulated nodes,
answer through the deployment's real gateway, scale, and a crashed one is restarted by the heartbeat's repair."""
from __future__ import annotations

import json

import pytest
import requests

from tests.controlplane.integration.live import IsolatedServices, live_stack_start, live_stack_stop
from tests.procs import free_port

pytestmark = [pytest.mark.integration, pytest.mark.backends]

NAME = "sim-demo"
NUM_NODES = 3


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    var_dir = tmp_path_factory.mktemp("tandem-simfleet")
    services = IsolatedServices(var_dir)
    stack = None
    try:
        stack = live_stack_start(var_dir, services, simulated_nodes=NUM_NODES, simulated_hosts=1)
        yield stack
    finally:
        if stack is not None:
            live_stack_stop(stack)
        services.close()


@pytest.fixture(scope="module")
def deployment(fleet, tiny_model_dir):
    gateway_port = free_port()
    response = fleet.api("POST", "deployments/", json={
        "name": NAME, "mode": "disaggregated", "model_path": str(tiny_model_dir),
        "engine_settings": {"simulate": "tiny-cpu"}, "replicas": {"prefill": 2, "decode": 2},
        "gateway_port": gateway_port})
    assert response.status_code == 202, response.text
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    fleet.wait_for("the gateway to answer a completion", lambda: _complete(gateway_url).status_code == 200,
                   timeout=120, interval=0.5)
    return gateway_url


def _complete(gateway_url: str) -> requests.Response:
    return requests.post(f"{gateway_url}/v1/completions", json={"model": NAME, "prompt": "one two", "max_tokens": 3},
                         timeout=10)


def _ready(fleet, role: str) -> list[dict]:
    return [w for w in fleet.workers(NAME, role=role) if w["status"] == "ready"]


def test_all_simulated_nodes_register_and_heartbeat(fleet):
    nodes = [n for n in fleet.api("GET", "nodes/").json() if n["name"].startswith(fleet.node_name)]
    assert len(nodes) == NUM_NODES
    assert all(n["labels"].get("simulated") == "true" for n in nodes)


def test_simulated_workers_serve_through_the_real_gateway(fleet, deployment):
    answer = _complete(deployment).json()
    assert answer["choices"][0]["text"].split() == ["sim", "tok", "alpha"]
    workers = fleet.wait_for("2 prefill and 2 decode ready",
                             lambda: (p := _ready(fleet, "prefill")) and len(p) == 2 and len(_ready(fleet, "decode"))
                             == 2 and p + _ready(fleet, "decode"))
    assert len({w["node"] for w in workers}) >= 2  # spread over the simulated nodes
    for worker in workers:
        health = requests.get(f"http://{worker['host']}:{worker['port']}/health", timeout=5).json()
        assert health["simulated"] is True and health["role"] == worker["role"]


def test_a_scale_is_carried_out_on_the_simulated_nodes(fleet, deployment):
    response = fleet.api("POST", f"deployments/{NAME}/scale", json={"role": "decode", "replicas": 4})
    assert response.status_code == 202, response.text
    fleet.wait_for("4 decode workers ready", lambda: len(_ready(fleet, "decode")) == 4, timeout=60)
    endpoints = fleet.wait_for("4 decode workers in membership", lambda: len(
        fleet.api("GET", f"deployments/{NAME}/endpoints").json()["groups"][0]["decode"]) == 4 or None)
    assert endpoints
    assert _complete(deployment).status_code == 200


def test_a_crashed_simulated_worker_is_restarted_by_its_node(fleet, deployment):
    hosts = json.loads((fleet.var_dir / f"simfleet-{fleet.node_name}.json").read_text())["hosts"]
    victim = _ready(fleet, "prefill")[0]
    killed = requests.delete(f"{hosts[0]}/workers/{victim['id']}", params={"kill": "1"}, timeout=5)
    assert killed.status_code == 202

    def replaced():
        ready = [w for w in _ready(fleet, "prefill") if w["id"] == victim["id"]]
        return ready and ready[0]["pid"] != victim["pid"] and ready[0]

    again = fleet.wait_for("the crashed worker to be restarted", replaced, timeout=60)
    assert requests.get(f"http://{again['host']}:{again['port']}/health", timeout=5).json()["status"] == "ok"
    assert _complete(deployment).status_code == 200
