"""A client that hangs up aborts its request in the engine: its KV blocks are freed at once."""
from __future__ import annotations

import json
import time

import pytest
import requests

from tests.inference.worker.support import (
    HTTP_TIMEOUT_S, generate, metric, start_worker, token_ids)

pytestmark = pytest.mark.integration

LONG = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True}


@pytest.fixture(scope="module")
def worker(tiny_model_dir, tmp_path_factory):
    proc = start_worker("colocated", "colocated", tiny_model_dir, tmp_path_factory.mktemp("logs"),
                        "--max-num-seqs", "1")
    yield proc
    proc.stop()


def wait_until(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_hanging_up_aborts_the_request_and_frees_its_kv_blocks(worker):
    wait_until(lambda: metric(worker.url, "tandem_requests_running") == 0)
    num_disconnects = metric(worker.url, "tandem_request_errors_total", kind="client_disconnect")
    r = requests.post(f"{worker.url}/v1/generate", json=LONG, stream=True, timeout=HTTP_TIMEOUT_S)
    lines = r.iter_lines()
    assert json.loads(next(lines))["type"] == "start"
    assert json.loads(next(lines))["type"] == "token"
    wait_until(lambda: metric(worker.url, "tandem_kv_cache_usage_ratio") > 0)
    r.close()  # hang up mid-stream

    wait_until(lambda: metric(worker.url, "tandem_kv_cache_usage_ratio") == 0
               and metric(worker.url, "tandem_requests_running") == 0)
    assert metric(worker.url, "tandem_request_errors_total", kind="client_disconnect") == num_disconnects + 1
    # Far fewer than 1000 tokens were generated: the engine stopped, it did not run the request to its end.
    assert metric(worker.url, "tandem_generation_tokens_total") < 900
    # The only slot is free again.
    assert len(token_ids(generate(worker.url, prompt="hi", max_tokens=2))) == 2
