"""A gateway the control plane starts holds the scrape token: its /metrics (every tenant's name, usage and limits)
answers only that token, and /health and /v1/models name the workers behind it only to it; a client gets a bare
liveness answer and the model list. Real gateway and simulated worker processes."""
from __future__ import annotations

import pytest
import requests

from inference.gateway.config import SCRAPE_TOKEN_ENV
from tests.inference.gateway.support import stop_all
from tests.procs import free_port, start, wait_http

pytestmark = pytest.mark.integration

TOKEN = "scrape-token-0123456789abcdef"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("operator-routes")
    port, gw_port = free_port(), free_port()
    worker = start("sim-worker", ["-m", "inference.worker", "--simulate", "tiny-cpu", "--role", "colocated",
                                  "--model", "/models/sim-model", "--port", str(port)], log_dir)
    gateway = start("gateway", ["-m", "inference.gateway", "--port", str(gw_port), "--colocated",
                                f"http://127.0.0.1:{port}"], log_dir, env={SCRAPE_TOKEN_ENV: TOKEN})
    gateway.url = f"http://127.0.0.1:{gw_port}"
    try:
        wait_http(gateway, gateway.url + "/health", timeout=60)
        yield gateway
    finally:
        stop_all([gateway, worker])


def test_metrics_answer_the_scrape_token_only(gateway):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Token {TOKEN}"}):
        refused = requests.get(gateway.url + "/metrics", headers=headers, timeout=10)
        assert refused.status_code == 401, headers
        assert refused.json()["error"]["code"] == "scrape_token_required"
        assert "/api/v1/prometheus/scrape-token" in refused.json()["error"]["message"]
    page = requests.get(gateway.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
    assert page.status_code == 200 and "tandem_gateway_admission_capacity" in page.text


def test_a_client_sees_liveness_and_the_model_but_no_worker_address(gateway):
    assert requests.get(gateway.url + "/health", timeout=10).json() == {"status": "ok"}
    (model,) = requests.get(gateway.url + "/v1/models", timeout=10).json()["data"]
    assert model["id"] == "tandem" and "workers" not in model and model["max_model_len"]
    operator = {"Authorization": f"Bearer {TOKEN}"}
    health = requests.get(gateway.url + "/health", headers=operator, timeout=10).json()
    assert health["status"] == "ok" and health["groups"][0]["colocated"][0]["url"].startswith("http://127.0.0.1:")
    (model,) = requests.get(gateway.url + "/v1/models", headers=operator, timeout=10).json()["data"]
    assert model["workers"][0]["state"] == "ready"
