"""After a request's first token nothing can be retried: a worker failure ends a stream with an SSE error chunk
then [DONE] and answers a non-streaming request 502; a client that goes away aborts the request on the worker.

The engine step that fails mid-way is a real worker's, in the test process, around its real engine in a test double
(tests/inference/worker/inprocess.py); the killed worker is a process SIGKILLed."""
from __future__ import annotations

import json
import socket
import time

import pytest
import requests

from tests.inference.gateway.support import WORKER_ARGS, complete, single_worker, start_gateway
from tests.inference.worker.inprocess import InProcessWorker

pytestmark = pytest.mark.integration

LONG = {"model": "tandem", "prompt": "Once upon a time", "max_tokens": 480, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    # The last test here kills it (it is restarted for any module that needs it afterwards).
    worker = single_worker(request, tmp_path_factory, tiny_model_dir)
    gateway = start_gateway("gateway", ["--colocated", worker.url],
                            tmp_path_factory.mktemp("gateway-failure-after-first-token"))
    yield gateway, worker
    gateway.stop()


def _metric(url: str, prefix: str) -> float:
    text = requests.get(url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def test_a_client_that_disconnects_mid_stream_aborts_the_request_on_the_worker(fleet):
    gateway, worker = fleet
    disconnects_before = _metric(worker.url, 'tandem_request_errors_total{kind="client_disconnect"')
    successes_before = _metric(worker.url, "tandem_request_success_total{")
    body = json.dumps({**LONG, "stream": True})
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 30
    while _metric(worker.url, 'tandem_request_errors_total{kind="client_disconnect"') <= disconnects_before:
        assert time.monotonic() < deadline, "the worker never saw the request aborted"
        time.sleep(0.05)
    assert _metric(worker.url, "tandem_request_success_total{") == successes_before
    assert _metric(gateway.url, "tandem_gateway_worker_outstanding_requests{") == 0


@pytest.fixture(scope="module")
def in_process(tiny_model_dir, tmp_path_factory):
    """A gateway in front of a worker in this process, whose engine the test can make fail."""
    worker = InProcessWorker("--role", "colocated", "--model", str(tiny_model_dir), *WORKER_ARGS,
                             "--max-num-seqs", "1", "--max-queue", "0").start()
    gateway = None
    try:
        worker.wait_ready()
        gateway = start_gateway("gateway-in-process", ["--colocated", worker.url],
                                tmp_path_factory.mktemp("gateway-failure-in-process"))
        yield gateway, worker
    finally:
        if gateway is not None:
            gateway.stop()
        worker.stop()


def test_a_non_streaming_request_that_fails_midway_answers_502(in_process):
    gateway, worker = in_process
    before = _metric(worker.url, "tandem_generation_tokens_total{")
    # The prefill step and 4 decode steps succeed, the next one raises, as a failed kernel does.
    worker.engine.steps_before_failing, worker.engine.fail_steps = 5, 1
    resp = complete(gateway.url, LONG, timeout=120)
    assert _metric(worker.url, "tandem_generation_tokens_total{") - before == 5  # the failure came mid-way
    assert resp.status_code == 502, resp.text
    error = resp.json()["error"]
    assert error["type"] == "upstream_error" and "engine step failed" in error["message"]


def test_a_stream_whose_worker_is_killed_ends_with_an_error_chunk_then_done(fleet):
    gateway, worker = fleet
    resp = requests.post(gateway.url + "/v1/completions", json={**LONG, "stream": True}, stream=True, timeout=60)
    assert resp.status_code == 200
    payloads = []
    for line in resp.iter_lines(decode_unicode=True):
        if not line:
            continue
        payloads.append(line.removeprefix("data: "))
        if len(payloads) == 1:
            worker.kill9()
    assert len(payloads) >= 3
    assert "choices" in json.loads(payloads[0])
    error = json.loads(payloads[-2])["error"]
    assert error["type"] == "upstream_error" and error["message"]
    assert payloads[-1] == "[DONE]"
    assert all(p != "[DONE]" for p in payloads[:-1])
