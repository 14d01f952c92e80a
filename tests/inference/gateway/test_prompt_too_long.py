"""A prompt that cannot fit the context in any tokenization (more characters than the workers' /health says
max_model_len tokens can spell) is refused by the gateway with a 400, before it costs a worker's tokenizer: the
worker never sees it. A prompt under the bound still goes to the worker, whose own check counts tokens."""
from __future__ import annotations

import socket

import pytest
import requests

from tests.inference.gateway.support import PLAIN_FLEET, shared_workers, start_gateway
from tests.inference.worker.support import metric

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    worker = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)["colocated"]
    gateway = start_gateway("gateway", ["--colocated", worker.url, "--max-body-bytes", str(4 << 20)],
                            tmp_path_factory.mktemp("gateway-prompt-too-long"))
    yield gateway, worker
    gateway.stop()


def test_a_prompt_longer_than_any_fitting_one_is_refused_at_the_gateway(fleet):
    gateway, worker = fleet
    health = requests.get(worker.url + "/health", timeout=10).json()
    limit = health["max_prompt_chars"]
    assert limit >= health["max_model_len"]  # at least a character a token
    seen_before = metric(worker.url, "tandem_request_errors_total") + metric(worker.url, "tandem_request_success_total")
    for body in ({"prompt": "a" * (limit + 1)}, {"messages": [{"role": "user", "content": "b" * (limit + 1)}]}):
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        resp = requests.post(gateway.url + path, json={"model": "tandem", "max_tokens": 2, **body}, timeout=60)
        assert resp.status_code == 400, resp.text
        error = resp.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == ("prompt" if "prompt" in body
                                                                                  else "messages")
        assert f"no prompt over {limit}" in error["message"]
    seen_after = metric(worker.url, "tandem_request_errors_total") + metric(worker.url, "tandem_request_success_total")
    assert seen_after == seen_before  # the worker never saw them


def test_a_prompt_under_the_bound_reaches_the_worker_which_counts_its_tokens(fleet):
    gateway, worker = fleet
    max_model_len = requests.get(worker.url + "/health", timeout=10).json()["max_model_len"]
    words = " ".join(["word"] * (max_model_len + 8))  # more tokens than the context, far fewer characters than the bound
    resp = requests.post(gateway.url + "/v1/completions", timeout=60,
                         json={"model": "tandem", "prompt": words, "max_tokens": 2})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "context_length_exceeded"
    assert "tokens" in resp.json()["error"]["message"]  # the worker's own words: it tokenized the prompt


def test_a_body_longer_than_any_fitting_prompt_is_refused_by_its_length_unread(fleet):
    """Its Content-Length alone decides: the answer comes while the body has not even been sent, and closes the
    connection (kept open, the server would read the unread body before the next request on it)."""
    gateway, worker = fleet
    limit = requests.get(worker.url + "/health", timeout=10).json()["max_prompt_chars"]
    length = limit * 6 + (256 << 10) + 1  # past every prompt that fits, escaped at worst; under --max-body-bytes
    host, port = gateway.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {length}\r\n\r\n{{\"prompt\": \"aaaa".encode())
        answer = b""
        while chunk := sock.recv(65536):  # to the end: the gateway closes the connection
            answer += chunk
    answer = answer.decode()
    assert answer.startswith("HTTP/1.1 400"), answer
    assert "context_length_exceeded" in answer and f"the request body has {length} bytes" in answer
    assert "Connection: close" in answer
