"""End to end, with real agents, workers and gateway: a colocated pool spread over two nodes weighs each worker by
its node's labels (the pool's routing_weights for class=compute, the other node's tandem.weight label), the
endpoints answer carries those weights, and the deployment's own gateway, polling it, routes by them and shows them
(/health, /v1/models, /metrics). How the gateway shares load by weight is unit-tested (test_weighted_pick.py) and
measured under real load by bench/gateway/weighted_routing.py."""
from __future__ import annotations

import pytest
import requests

from tests.procs import free_port

pytestmark = pytest.mark.integration
NAME = "it-weighted"


def _gateway_weights(gateway_url: str, headers: dict[str, str]) -> dict[str, float] | None:
    """url → weight of the ready workers the gateway routes to, once both are ready."""
    try:
        health = requests.get(f"{gateway_url}/health", timeout=10, headers=headers).json()
    except (requests.RequestException, ValueError):
        return None
    workers = [w for group in health.get("groups", []) for w in group.get("colocated", []) if w["state"] == "ready"]
    return {w["url"]: w["weight"] for w in workers} if len(workers) == 2 else None


def test_the_gateway_routes_by_the_weights_the_control_plane_computes_from_node_labels(live, tiny_model_dir,
                                                                                       second_node):
    labelled = live.api("PATCH", f"nodes/{second_node}/", json={"labels": {"class": "bandwidth",
                                                                           "tandem.weight": "2"}})
    assert labelled.ok, labelled.text
    gateway_port = free_port()
    created = live.api("POST", "deployments/", json={
        "name": NAME, "mode": "colocated", "model_path": str(tiny_model_dir), "dtype": "float32",
        "engine_settings": {"threads": 1, "kv_cache_bytes": 8 << 20}, "gateway_port": gateway_port,
        "replicas": {"colocated": 2},
        "placement": {"colocated": {"routing_weights": [{"selector": {"class": "compute"}, "weight": 3}]}}})
    assert created.status_code == 202, created.text
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    operator = live.scrape_headers()
    try:
        weights = live.wait_for("the gateway to route to both weighted workers",
                                lambda: _gateway_weights(gateway_url, operator), timeout=180, interval=0.5)
        urls = {w["node"]: w["url"] for w in live.workers(NAME, role="colocated") if w["status"] == "ready"}
        assert weights == {urls[live.node_name]: 3, urls[second_node]: 2}
        group, = live.api("GET", f"deployments/{NAME}/endpoints").json()["groups"]
        assert group["weights"] == weights
        # The gateway shows each worker's weight in /v1/models and /metrics too.
        models = requests.get(f"{gateway_url}/v1/models", timeout=10, headers=operator).json()["data"][0]["workers"]
        assert {w["url"]: w["weight"] for w in models} == weights
        metrics = live.gateway_metrics(gateway_url)
        shown = {url: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                 if line.startswith("tandem_gateway_worker_weight{")
                 for url in weights if f'worker="{url}"' in line}
        assert shown == weights, metrics
        answer = requests.post(f"{gateway_url}/v1/completions", timeout=60, json={
            "model": NAME, "prompt": "Hello", "max_tokens": 4, "temperature": 0})
        assert answer.status_code == 200, answer.text
    finally:
        deleted = live.api("DELETE", f"deployments/{NAME}/")
        if deleted.status_code == 202:
            live.wait_for("the weighted deployment to be deleted",
                          lambda: live.api("GET", f"deployments/{NAME}/").status_code == 404, timeout=90)
