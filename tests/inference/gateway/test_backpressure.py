"""Backpressure answers 429 with Retry-After in OpenAI's error shape: when every worker is at
--max-outstanding-per-worker, and when the worker itself answers 429 (its admission queue is full).

The worker is made to hold requests by its test-only stall fault (its engine loop sleeps 6 s), so that two
requests are surely in flight together, even on a loaded host that is slow to send them."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.inference.gateway.support import complete, faulty_worker, start_gateway, stop_all

pytestmark = pytest.mark.integration

BODY = {"model": "tandem", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    # One request in flight fills this worker: the next one gets the worker's own 429.
    worker = faulty_worker(request, tmp_path_factory, tiny_model_dir)
    log_dir = tmp_path_factory.mktemp("gateway-backpressure")
    limited = start_gateway("gateway-limited", ["--colocated", worker.url, "--max-outstanding-per-worker", "1"],
                            log_dir)
    unlimited = start_gateway("gateway-unlimited", ["--colocated", worker.url], log_dir)
    yield worker, limited, unlimited
    stop_all([limited, unlimited])


def _two_at_once_during_a_stall(worker_url: str, gateway_url: str) -> list[requests.Response]:
    requests.post(worker_url + "/debug/fault", json={"kind": "stall", "seconds": 6}, timeout=5).raise_for_status()
    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda _: complete(gateway_url, BODY, timeout=60), range(2)))
    return sorted(answers, key=lambda r: r.status_code)


def _assert_429(resp: requests.Response) -> dict:
    assert resp.status_code == 429, resp.text
    assert int(resp.headers["Retry-After"]) >= 1
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "rate_limit_error" and error["code"] == "overloaded"
    return error


def test_a_request_beyond_the_gateway_outstanding_limit_gets_429(fleet):
    worker, limited, _ = fleet
    served, refused = _two_at_once_during_a_stall(worker.url, limited.url)
    assert served.status_code == 200, served.text
    assert "1 outstanding" in _assert_429(refused)["message"]
    assert complete(limited.url, BODY).status_code == 200


def test_a_full_worker_429_comes_back_as_429(fleet):
    worker, _, unlimited = fleet
    served, refused = _two_at_once_during_a_stall(worker.url, unlimited.url)
    assert served.status_code == 200, served.text
    assert "full" in _assert_429(refused)["message"]
    assert complete(unlimited.url, BODY).status_code == 200
