"""The gateway's /health says 503 with the reason while no complete worker group is ready, and requests get 503."""
from __future__ import annotations

import requests

from tests.inference.gateway.support import complete, start_gateway
from tests.procs import free_port


def test_it_is_unavailable_and_names_the_unreachable_worker(log_dir):
    dead = f"http://127.0.0.1:{free_port()}"
    gateway = start_gateway("gateway", ["--colocated", dead], log_dir, wait_ready=False)
    try:
        health = requests.get(gateway.url + "/health", timeout=5)
        assert health.status_code == 503
        assert dead in health.json()["reason"]
        resp = complete(gateway.url, {"model": "tandem", "prompt": "hello"})
        assert resp.status_code == 503
        assert resp.headers["Retry-After"]
        assert resp.json()["error"]["code"] == "no_ready_workers"
    finally:
        gateway.stop()


def test_a_disaggregated_group_without_decode_is_not_ready(log_dir):
    prefill, decode = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    gateway = start_gateway("gateway", ["--prefill", prefill, "--decode", decode], log_dir, wait_ready=False)
    try:
        reason = requests.get(gateway.url + "/health", timeout=5).json()["reason"]
        assert "no ready prefill worker" in reason and "no ready decode worker" in reason
    finally:
        gateway.stop()
