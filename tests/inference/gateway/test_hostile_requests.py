"""Requests any anonymous client can send (lone UTF-16 surrogates, JSON nested 5,000 deep) are answered 4xx, and
every worker stays in rotation: the normal requests sent between them all succeed.

They once made a worker answer 500 (its tokenizer raised) and the gateway eject it, or the gateway itself answer 500
(RecursionError). The gateways here probe every 60 s, so an ejected worker would stay out for the whole test.
How much throughput the other clients keep is measured by tests/reliability/hostile_load.py, not asserted here."""
from __future__ import annotations

import pytest
import requests

from tests.inference.gateway.support import (
    HOSTILE_REQUESTS, PLAIN_FLEET, complete, shared_workers, start_gateway, stop_all, worker_states)
from tests.inference.worker.support import metric

pytestmark = pytest.mark.integration

NORMAL = {"model": "tandem", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    workers = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)
    log_dir = tmp_path_factory.mktemp("gateway-hostile")
    gateways = {
        "disaggregated": start_gateway("gateway-disaggregated", [
            "--prefill", workers["prefill"].url, "--decode", workers["decode"].url, "--health-interval", "60"],
            log_dir),
        "colocated": start_gateway("gateway-colocated", ["--colocated", workers["colocated"].url,
                                                         "--health-interval", "60"], log_dir),
    }
    yield gateways, workers
    stop_all(list(gateways.values()))


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_hostile_requests_get_4xx_and_the_workers_stay_in_rotation(fleet, mode):
    gateways, workers = fleet
    gateway = gateways[mode]
    for _ in range(3):
        for name, path, raw in HOSTILE_REQUESTS:
            resp = requests.post(gateway.url + path, data=raw, headers={"Content-Type": "application/json"},
                                 timeout=30)
            assert 400 <= resp.status_code < 500, (name, resp.status_code, resp.text)
            error = resp.json()["error"]
            assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
            normal = complete(gateway.url, NORMAL)
            assert normal.status_code == 200, (name, normal.text)
    assert {state for state, _ in worker_states(gateway.url).values()} == {"ready"}
    for worker in workers.values():
        assert metric(worker.url, "tandem_request_errors_total", kind="internal") == 0
