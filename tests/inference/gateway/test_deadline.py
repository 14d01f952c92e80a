"""A request with no first token, or no end, within --request-timeout answers 504 in OpenAI's error shape: nothing
hangs."""
from __future__ import annotations

import json
import os
import signal
import time

import pytest
import requests

from tests.inference.gateway.support import complete, single_worker, start_gateway

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    worker = single_worker(request, tmp_path_factory, tiny_model_dir)
    # Probes every 60 s: a worker stopped for a test is not ejected meanwhile (the request meets it, not a 503).
    gateway = start_gateway("gateway", ["--colocated", worker.url, "--request-timeout", "1", "--health-interval", "60"],
                            tmp_path_factory.mktemp("gateway-deadline"))
    yield gateway, worker
    gateway.stop()


def test_a_request_stuck_on_a_stopped_worker_times_out_with_504(fleet):
    gateway, worker = fleet
    # The worker is stopped by the OS (SIGSTOP) for the whole request: its kernel accepts the connection, nothing
    # answers on it, until the gateway's 1 s deadline has answered.
    os.kill(worker.popen.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        resp = complete(gateway.url, {"model": "tandem", "prompt": "hello", "max_tokens": 2}, timeout=30)
        elapsed = time.monotonic() - started
    finally:
        os.kill(worker.popen.pid, signal.SIGCONT)
    assert resp.status_code == 504, resp.text
    error = resp.json()["error"]
    assert error["type"] == "timeout_error" and "request-timeout" in error["message"]
    assert 0.9 <= elapsed < 6  # the deadline answered, not a refusal nor the worker
    # The worker is shared with other modules: leave it serving again.
    deadline = time.monotonic() + 60
    while complete(gateway.url, {"model": "tandem", "prompt": "hello", "max_tokens": 2}).status_code != 200:
        assert time.monotonic() < deadline, "the worker never served again after it was continued"
        time.sleep(0.5)


def test_a_stream_whose_worker_stalls_mid_way_ends_at_the_deadline_with_an_error_event(fleet, tmp_path):
    """The deadline may fall while the gateway waits for the next token (not only for the first): the stream ends
    with an error event and [DONE], and the worker's stream is closed cleanly. The worker is stopped by the OS
    (SIGSTOP) after the first chunk; the gateway's probes would eject it only after ~2 s, the 1.5 s deadline comes
    first."""
    _, worker = fleet
    gateway = start_gateway("gateway-deadline-mid", ["--colocated", worker.url, "--request-timeout", "1.5"], tmp_path)
    try:
        with requests.post(gateway.url + "/v1/completions", stream=True, timeout=60, json={
                "model": "tandem", "prompt": "hello", "max_tokens": 500, "ignore_eos": True, "stream": True}) as resp:
            assert resp.status_code == 200, resp.text
            lines = resp.iter_lines(decode_unicode=True)
            assert next(line for line in lines if line.startswith("data: "))  # the first token: mid-stream now
            os.kill(worker.popen.pid, signal.SIGSTOP)
            try:
                rest = [line.removeprefix("data: ") for line in lines if line.startswith("data: ")]
            finally:
                os.kill(worker.popen.pid, signal.SIGCONT)
        assert rest[-1] == "[DONE]"
        errors = [json.loads(line)["error"] for line in rest[:-1] if '"error"' in line]
        assert errors and "request-timeout" in errors[-1]["message"], rest[-3:]
        log = gateway.log()
        assert "Traceback" not in log and "already running" not in log, log
    finally:
        gateway.stop()
