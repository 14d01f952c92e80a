"""A worker that answers one request with an error stays in rotation: only a failed connection or a failed health
probe takes a worker out. Before, any 5xx ejected it, so a client that could make a worker fail (a lone surrogate
in a prompt did) kept a deployment at zero successful requests."""
from __future__ import annotations

import pytest
import requests

from tests.inference.gateway.support import PLAIN_FLEET, WORKER_ARGS, complete, shared_workers, start_gateway
from tests.inference.worker.inprocess import InProcessWorker

pytestmark = pytest.mark.integration

BODY = {"model": "tandem", "prompt": "Permission is hereby granted", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    shared = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)
    log_dir = tmp_path_factory.mktemp("gateway-worker-error")
    # This module's own prefill worker, in the test process: the test makes its engine's next step fail (answered
    # 503), through the test double around its real engine (tests/inference/worker/inprocess.py).
    prefill = InProcessWorker("--role", "prefill", "--model", str(tiny_model_dir), *WORKER_ARGS).start()
    gateway = None
    try:
        prefill.wait_ready()
        # Probes every 60 s: a worker ejected by the failed request would stay out for the whole test.
        gateway = start_gateway("gateway", ["--prefill", prefill.url, "--decode", shared["decode"].url,
                                            "--health-interval", "60"], log_dir)
        yield gateway, prefill
    finally:
        if gateway is not None:
            gateway.stop()
        prefill.stop()


def test_a_prefill_worker_that_fails_one_request_keeps_serving_the_next(fleet):
    gateway, prefill = fleet
    prefill.engine.fail_steps = 1
    failed = complete(gateway.url, BODY)
    assert failed.status_code == 502, failed.text
    assert "engine step failed: CUDA error" in failed.json()["error"]["message"]
    after = complete(gateway.url, BODY)
    assert after.status_code == 200, after.text
    health = requests.get(gateway.url + "/health", timeout=10).json()
    assert [w["state"] for w in health["groups"][0]["prefill"]] == ["ready"]
