"""/health is 200 only while the model is loaded and the engine loop ticks; an engine failure fails its requests only.

Faults are injected through POST /debug/fault, which exists only with --enable-test-faults (a test aid).
"""
from __future__ import annotations

import json
import time

import pytest
import requests

from tests.inference.worker.support import HTTP_TIMEOUT_S, START_TIMEOUT_S, generate, metric, start_worker, token_ids
from tests.procs import wait_http

pytestmark = pytest.mark.integration

FAULT_ARGS = ["--enable-test-faults", "--test-load-delay", "2"]  # the load delay lets a test see "starting"


@pytest.fixture(scope="module")
def worker(tiny_model_dir, tmp_path_factory):
    proc = start_worker("colocated", "colocated", tiny_model_dir, tmp_path_factory.mktemp("logs"),
                        "--stall-timeout", "1", *FAULT_ARGS, wait=False)
    yield proc
    proc.stop()


def health(url: str) -> requests.Response:
    return requests.get(f"{url}/health", timeout=HTTP_TIMEOUT_S)


def inject(url: str, kind: str, **extra) -> None:
    r = requests.post(f"{url}/debug/fault", json={"kind": kind, **extra}, timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 200, r.text


def wait_for_status(url: str, status: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    body = None
    while time.monotonic() < deadline:
        try:
            body = health(url).json()
        except requests.ConnectionError:
            body = None
        if body and body["status"] == status:
            return body
        time.sleep(0.05)
    raise AssertionError(f"/health never said {status!r} (last: {body})")


def test_it_answers_503_starting_while_the_model_loads_then_200(worker):
    body = wait_for_status(worker.url, "starting")
    assert body["reason"]
    assert health(worker.url).status_code == 503
    wait_http(worker, f"{worker.url}/health", timeout=START_TIMEOUT_S)
    body = health(worker.url).json()
    assert isinstance(body.pop("weight_bytes"), int)
    assert body == {"status": "ok", "role": "colocated", "model": "tiny", "revision": None, "dtype": "float32",
                    "max_model_len": 1024, "quantization": "none", "prefix_caching": True,
                    "max_prompt_chars": 1024 * 64}  # the tiny tokenizer's longest token is 64 characters


def test_an_engine_step_error_fails_the_open_request_and_the_worker_goes_on(worker):
    wait_http(worker, f"{worker.url}/health", timeout=START_TIMEOUT_S)
    inject(worker.url, "step_error")
    events = generate(worker.url, prompt="Hello", max_tokens=4)
    assert events[0]["type"] == "start"
    assert events[-1]["type"] == "error" and events[-1]["kind"] == "engine"
    assert "injected step failure" in events[-1]["message"]
    assert health(worker.url).status_code == 200
    assert len(token_ids(generate(worker.url, prompt="Hello", max_tokens=4))) == 4
    assert metric(worker.url, "tandem_request_errors_total", kind="engine") == 1
    assert metric(worker.url, "tandem_kv_cache_usage_ratio") == 0


def test_a_stuck_loop_reads_dead_until_it_ticks_again(worker):
    wait_http(worker, f"{worker.url}/health", timeout=START_TIMEOUT_S)
    # The loop sleeps 6 s; --stall-timeout is 1 s: "dead" for 5 s, room for this test to be late on a loaded host.
    inject(worker.url, "stall", seconds=6)
    body = wait_for_status(worker.url, "dead", timeout=10)
    assert "not ticked" in body["reason"]
    wait_for_status(worker.url, "ok", timeout=20)


def test_a_stall_of_a_bad_length_is_a_400_that_says_so(worker):
    for seconds in (0, -1, 61, "2", True):
        r = requests.post(f"{worker.url}/debug/fault", json={"kind": "stall", "seconds": seconds},
                          timeout=HTTP_TIMEOUT_S)
        assert r.status_code == 400 and r.json()["error"]["param"] == "seconds", r.text
        assert "seconds must be a number in (0, 60]" in r.json()["error"]["message"]


def test_a_dead_loop_fails_open_requests_and_reads_dead_while_http_still_answers(worker):
    wait_http(worker, f"{worker.url}/health", timeout=START_TIMEOUT_S)
    body = {"prompt": "Hello", "max_tokens": 1000, "ignore_eos": True}
    with requests.post(f"{worker.url}/v1/generate", json=body, stream=True, timeout=HTTP_TIMEOUT_S) as r:
        lines = r.iter_lines()
        assert json.loads(next(lines))["type"] == "start"
        assert json.loads(next(lines))["type"] == "token"
        inject(worker.url, "die")
        last = [json.loads(line) for line in lines if line][-1]
    assert last["type"] == "error" and "engine loop" in last["message"]
    body = wait_for_status(worker.url, "dead", timeout=10)
    assert "injected engine-loop death" in body["reason"]
    assert requests.get(f"{worker.url}/metrics", timeout=HTTP_TIMEOUT_S).status_code == 200
    r = requests.post(f"{worker.url}/v1/generate", json={"prompt": "hi"}, timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 503 and r.json()["error"]["code"] == "dead"
    assert worker.alive()
