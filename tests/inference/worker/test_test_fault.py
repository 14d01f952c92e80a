"""`--test-fault` (a test aid, inference/worker/faults.py): `error` makes every generation request of every role
answer HTTP 500 with a JSON error, `slow:<seconds>` waits that long before each token; either way /health stays ok
and, like /info, says `test_fault`, and the event loop keeps answering while a slow request crawls."""
from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from tests.inference.worker.support import HTTP_TIMEOUT_S, START_TIMEOUT_S, metric, start_worker
from tests.procs import wait_http

pytestmark = pytest.mark.integration

SLOW_S = 2.0
NUM_SLOW_TOKENS = 3


@pytest.fixture(scope="module")
def workers(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("test-fault")
    specs = {"colocated-error": ("colocated", "error"), "prefill-error": ("prefill", "error"),
             "decode-error": ("decode", "error"), "colocated-slow": ("colocated", f"slow:{SLOW_S}")}
    procs = {name: start_worker(name, role, tiny_model_dir, log_dir, "--test-fault", fault, wait=False)
             for name, (role, fault) in specs.items()}
    try:
        for proc in procs.values():
            wait_http(proc, proc.url + "/health", timeout=START_TIMEOUT_S * 4)  # four loads at once
        yield procs
    finally:
        for proc in procs.values():
            proc.stop()


def _assert_test_fault_error(resp: requests.Response) -> None:
    assert resp.status_code == 500, resp.text
    error = resp.json()["error"]
    assert error["type"] == "test_fault" and error["code"] == "test_fault"
    assert "--test-fault error" in error["message"]


def test_health_and_info_stay_ok_and_say_the_test_fault(workers):
    for name, fault in (("colocated-error", "error"), ("prefill-error", "error"), ("decode-error", "error"),
                        ("colocated-slow", f"slow:{SLOW_S}")):
        health = requests.get(workers[name].url + "/health", timeout=HTTP_TIMEOUT_S)
        assert health.status_code == 200 and health.json()["status"] == "ok"
        assert health.json()["test_fault"] == fault, name
        assert requests.get(workers[name].url + "/info", timeout=HTTP_TIMEOUT_S).json()["test_fault"] == fault


def test_a_bad_value_stops_the_worker_naming_the_flag(tiny_model_dir, tmp_path):
    # Parsed before the model loads: a bad value stops the worker at once, naming the flag.
    bad = start_worker("bad", "colocated", tiny_model_dir, tmp_path, "--test-fault", "slow:-1", wait=False)
    assert bad.popen.wait(60) == 2
    assert "--test-fault slow:<seconds> needs seconds above 0" in bad.log()


def test_error_fails_every_generation_request_with_a_500(workers):
    before = metric(workers["colocated-error"].url, "tandem_request_errors_total", kind="test_fault")
    _assert_test_fault_error(requests.post(workers["colocated-error"].url + "/v1/generate",
                                           json={"prompt": "hello", "max_tokens": 2}, timeout=HTTP_TIMEOUT_S))
    assert metric(workers["colocated-error"].url, "tandem_request_errors_total", kind="test_fault") == before + 1
    _assert_test_fault_error(requests.post(workers["prefill-error"].url + "/v1/prefill", timeout=HTTP_TIMEOUT_S,
                                           json={"prompt": "hello", "max_tokens": 2,
                                                 "decode_url": workers["decode-error"].url}))
    _assert_test_fault_error(requests.post(workers["decode-error"].url + "/v1/kv", data=b"\0" * 64,
                                           headers={"Content-Type": "application/octet-stream"},
                                           timeout=HTTP_TIMEOUT_S))
    _assert_test_fault_error(requests.get(workers["decode-error"].url + "/v1/stream/some-request",
                                          timeout=HTTP_TIMEOUT_S))


def test_slow_waits_before_each_token_while_health_keeps_answering(workers):
    url = workers["colocated-slow"].url
    body = {"prompt": "hello", "max_tokens": NUM_SLOW_TOKENS, "ignore_eos": True, "temperature": 0}
    times: list[float] = []
    done = threading.Event()

    def run() -> None:
        try:
            started = time.monotonic()
            with requests.post(url + "/v1/generate", json=body, stream=True, timeout=HTTP_TIMEOUT_S) as resp:
                for line in resp.iter_lines():
                    if line and json.loads(line)["type"] == "token":
                        times.append(time.monotonic() - started)
        finally:
            done.set()

    thread = threading.Thread(target=run)
    thread.start()
    probe_seconds = []
    try:
        while not times and not done.is_set():  # probe only while the request is between its tokens
            time.sleep(0.01)
        while not done.is_set():
            started = time.monotonic()
            health = requests.get(url + "/health", timeout=HTTP_TIMEOUT_S)
            probe_seconds.append(time.monotonic() - started)
            assert health.status_code == 200 and health.json()["status"] == "ok"
    finally:
        thread.join(HTTP_TIMEOUT_S)
    assert len(times) == NUM_SLOW_TOKENS
    # Each token waited at least SLOW_S after the one before it (the first after the request started).
    gaps = [times[0], *(b - a for a, b in zip(times, times[1:]))]
    assert all(gap >= SLOW_S * 0.95 for gap in gaps), gaps
    # The wait is not on the event loop: between the first token and the last, the gateway's probes
    # (--health-timeout 1 s by default) keep being answered. Were the worker asleep on its event loop, each probe
    # would wait out the rest of a SLOW_S pause (a blocking sleep was tried: a single probe got through).
    probe_seconds.sort()
    assert len(probe_seconds) >= 3 and probe_seconds[len(probe_seconds) // 2] < 1.0, probe_seconds
