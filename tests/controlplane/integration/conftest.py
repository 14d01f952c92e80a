"""One live stack and one disaggregated tiny-model deployment for the whole integration session (2 cores: model
loads and process starts are the cost). Tests leave the deployment as they found it: 1 prefill, 1 decode, ready."""
from __future__ import annotations

import pytest
import requests

from tests.controlplane.integration.live import IsolatedServices, live_stack_start, live_stack_stop
from tests.procs import free_port

DEPLOYMENT = "it-demo"


@pytest.fixture(scope="session")
def live(tmp_path_factory):
    var_dir = tmp_path_factory.mktemp("tandem-it")
    services = IsolatedServices(var_dir)
    stack = None
    try:
        stack = live_stack_start(var_dir, services)
        yield stack
    finally:
        if stack is not None:
            live_stack_stop(stack)
        services.close()


def completion(gateway_url: str, prompt: str = "Hello", max_tokens: int = 4, timeout: float = 30):
    return requests.post(f"{gateway_url}/v1/completions", timeout=timeout,
                         json={"model": DEPLOYMENT, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})


def ready_workers(live, role: str | None = None) -> list[dict]:
    filters = {"role": role} if role else {}
    return [w for w in live.workers(DEPLOYMENT, **filters) if w["status"] == "ready"]


def wait_steady(live, *, prefill: int = 1, decode: int = 1, revision: int | None = None, timeout: float = 120):
    """Until exactly these many ready workers serve (of `revision` when given) and nothing else is in flight."""
    def steady():
        workers = [w for w in live.workers(DEPLOYMENT) if w["role"] != "gateway"]
        serving = [w for w in workers if w["status"] in ("pending", "starting", "ready", "draining")]
        ready = [w for w in serving if w["status"] == "ready" and (revision is None or w["revision"] == revision)]
        counts = {role: sum(w["role"] == role for w in ready) for role in ("prefill", "decode")}
        if counts == {"prefill": prefill, "decode": decode} and len(serving) == prefill + decode:
            return ready
        return None

    return live.wait_for(f"{prefill} prefill + {decode} decode ready", steady, timeout=timeout)


@pytest.fixture(scope="session")
def deployment(live, tiny_model_dir):
    """`it-demo`: created through the API; yields its gateway URL once the gateway answers a completion."""
    gateway_port = free_port()
    response = live.api("POST", "deployments/", json={
        "name": DEPLOYMENT, "mode": "disaggregated", "model_path": str(tiny_model_dir), "dtype": "float32",
        "engine_settings": {"threads": 1, "kv_cache_bytes": 16 << 20},
        "replicas": {"prefill": 1, "decode": 1}, "gateway_port": gateway_port,
    })
    assert response.status_code == 202, response.text
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    live.wait_for("the gateway to answer a completion",
                  lambda: completion(gateway_url, timeout=10).status_code == 200, timeout=150, interval=0.5)
    return gateway_url
