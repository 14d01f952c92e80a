"""Backpressure answers 429 with Retry-After in OpenAI's error shape: when every worker is at
--max-outstanding-per-worker, and when the worker itself answers 429 (its admission queue is full).

The worker (one request fills it) runs in the test process around its real engine in a test double
(tests/inference/worker/inprocess.py) whose steps hang until the test lets them go: the first request is surely still
in flight when the second comes, however fast the model and however loaded the host."""
from __future__ import annotations

import threading
import time

import pytest
import requests

from tests.inference.gateway.support import WORKER_ARGS, complete, start_gateway, stop_all
from tests.inference.worker.inprocess import InProcessWorker

pytestmark = pytest.mark.integration

BODY = {"model": "tandem", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, tmp_path_factory):
    # One request in flight fills this worker: the next one gets the worker's own 429.
    worker = InProcessWorker("--role", "colocated", "--model", str(tiny_model_dir), *WORKER_ARGS,
                             "--max-num-seqs", "1", "--max-queue", "0").start()
    gateways = []
    try:
        worker.wait_ready()
        log_dir = tmp_path_factory.mktemp("gateway-backpressure")
        # No admission queue: a full fleet answers 429 at once (a queue would hold the second request instead).
        gateways.append(start_gateway("gateway-limited", ["--colocated", worker.url, "--admission-queue", "0",
                                                          "--max-outstanding-per-worker", "1"], log_dir))
        gateways.append(start_gateway("gateway-unlimited", ["--colocated", worker.url], log_dir))
        yield worker, *gateways
    finally:
        stop_all(gateways)
        worker.stop()


def _two_at_once(worker: InProcessWorker, gateway_url: str) -> tuple[requests.Response, requests.Response]:
    """A first request that the worker holds (its engine's steps hang), and a second one sent meanwhile: both
    answers, the second's first."""
    worker.engine.running.clear()
    first = {}
    thread = threading.Thread(target=lambda: first.setdefault("resp", complete(gateway_url, BODY, timeout=60)))
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not worker.server.jobs:
            assert time.monotonic() < deadline, f"the first request never reached the worker: {first}"
            time.sleep(0.01)
        second = complete(gateway_url, BODY, timeout=60)
    finally:
        worker.engine.running.set()
        thread.join(60)
    return second, first["resp"]


def _assert_429(resp: requests.Response) -> dict:
    assert resp.status_code == 429, resp.text
    assert int(resp.headers["Retry-After"]) >= 1
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "rate_limit_error" and error["code"] == "overloaded"
    return error


def test_a_request_beyond_the_gateway_outstanding_limit_gets_429(fleet):
    worker, limited, _ = fleet
    refused, served = _two_at_once(worker, limited.url)
    assert "1 outstanding" in _assert_429(refused)["message"]
    assert served.status_code == 200, served.text
    assert complete(limited.url, BODY).status_code == 200


def test_a_full_worker_429_comes_back_as_429(fleet):
    worker, _, unlimited = fleet
    refused, served = _two_at_once(worker, unlimited.url)
    assert "full" in _assert_429(refused)["message"]
    assert served.status_code == 200, served.text
    assert complete(unlimited.url, BODY).status_code == 200
