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


def test_the_trace_records_served_requests_for_the_control_plane_only(gateway):
    """What a replay reads: one record per served request, with shared prompt prefixes as shared block hashes, its
    token counts and client-side timings; a refused body leaves no record; only the scrape token reads it."""
    operator = {"Authorization": f"Bearer {TOKEN}"}
    last = requests.get(gateway.url + "/trace", headers=operator, timeout=10).json()["last"]
    head = "You are a careful assistant. " * 40  # several whole blocks, shared by the first two prompts
    prompts = [head + "Tell me about tides.", head + "And about waves?", "short and unshared"]
    for i, prompt in enumerate(prompts):
        answer = requests.post(gateway.url + "/v1/completions", timeout=60, stream=i == 1,
                               json={"model": "tandem", "prompt": prompt, "max_tokens": 5, "stream": i == 1})
        assert answer.status_code == 200
        answer.content  # noqa: B018  (reads a streamed answer to its end)
    assert requests.post(gateway.url + "/v1/completions", json={"model": "tandem", "prompt": 7},
                         timeout=10).status_code == 400
    assert requests.get(gateway.url + "/trace", timeout=10).status_code == 401
    page = requests.get(gateway.url + "/trace", params={"after": last}, headers=operator, timeout=10).json()
    records = page["records"]
    assert [r["seq"] for r in records] == [last + 1, last + 2, last + 3] and page["last"] == last + 3
    assert all(r["outcome"] == "ok" and r["completion_tokens"] == 5 and r["max_tokens"] == 5 for r in records)
    assert all(0 < r["ttft_s"] <= r["e2e_s"] and r["prompt_tokens"] > 0 and not r["prompt_estimated"]
               for r in records)
    first, second, third = records
    shared = len(head) // 256
    assert shared >= 3 and first["hashes"][:shared] == second["hashes"][:shared] and third["hashes"] == []
    assert first["tenant"] and first["block_tokens"] >= 1
    assert requests.get(gateway.url + "/trace", params={"after": last + 3}, headers=operator,
                        timeout=10).json()["records"] == []
