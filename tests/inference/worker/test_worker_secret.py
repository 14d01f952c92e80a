"""A worker with a worker secret (inference.worker_secret) answers its request routes only to a caller that sends it:
401 without, 403 with a wrong one, before the body is read; /health, /metrics and /info stay open. A prefill worker
sends the secret on with its KV push, so the disaggregated path works end to end; a simulated worker (the same
server) checks it too, also when a simulated worker host starts it."""
from __future__ import annotations

import pytest
import requests

from inference.worker_secret import SECRET_ENV, SECRET_HEADER
from tests.inference.worker.support import (
    HTTP_TIMEOUT_S, assert_openai_error, read_stream, text, workers_started)
from tests.procs import free_port, start, wait_http

pytestmark = pytest.mark.integration

SECRET = "revision-7-secret"
GOOD = {SECRET_HEADER: SECRET}
WRONG = {SECRET_HEADER: "revision-6-secret"}


@pytest.fixture(scope="module")
def pair(tiny_model_dir, tmp_path_factory):
    """A real prefill and decode worker of one revision, holding its secret (as the node agent starts them)."""
    with workers_started(("prefill", "decode"), tiny_model_dir, tmp_path_factory.mktemp("worker-secret"),
                         "--revision", "7", env={SECRET_ENV: SECRET}) as started:
        yield started


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    port = free_port()
    proc = start("sim-colocated", ["-m", "inference.worker", "--simulate", "tiny-cpu", "--role", "colocated",
                                   "--model", "/m/sim", "--port", str(port)],
                 tmp_path_factory.mktemp("worker-secret-sim"), env={SECRET_ENV: SECRET})
    proc.url = f"http://127.0.0.1:{port}"
    wait_http(proc, proc.url + "/health", timeout=60)
    yield proc
    proc.stop()


def _prefill_body(pair, request_id: str) -> dict:
    return {"request_id": request_id, "prompt": "The quick brown fox", "max_tokens": 4, "temperature": 0,
            "ignore_eos": True, "decode_url": pair["decode"].url}


@pytest.mark.parametrize("method, path", [("post", "/v1/prefill"), ("post", "/v1/kv"),
                                          ("get", "/v1/stream/some-request")])
def test_a_request_route_without_the_secret_is_a_401_naming_the_header(pair, method, path):
    role = "prefill" if path == "/v1/prefill" else "decode"
    r = requests.request(method, pair[role].url + path, json=_prefill_body(pair, "no-secret"),
                         timeout=HTTP_TIMEOUT_S)
    error = assert_openai_error(r, 401, SECRET_HEADER)
    assert error["type"] == "authentication_error" and error["code"] == "missing_worker_secret"


@pytest.mark.parametrize("method, path", [("post", "/v1/prefill"), ("post", "/v1/kv"),
                                          ("get", "/v1/stream/some-request")])
def test_a_request_route_with_a_wrong_secret_is_a_403(pair, method, path):
    role = "prefill" if path == "/v1/prefill" else "decode"
    r = requests.request(method, pair[role].url + path, json=_prefill_body(pair, "wrong-secret"), headers=WRONG,
                         timeout=HTTP_TIMEOUT_S)
    error = assert_openai_error(r, 403, "secret")
    assert error["code"] == "wrong_worker_secret"


def test_probes_and_scrapes_need_no_secret(pair):
    for proc in pair.values():
        for path in ("/health", "/metrics", "/info"):
            assert requests.get(proc.url + path, timeout=HTTP_TIMEOUT_S).status_code == 200, path


def test_refusals_are_counted_as_unauthorized(pair):
    requests.post(pair["prefill"].url + "/v1/prefill", json={}, timeout=HTTP_TIMEOUT_S)
    metrics = requests.get(pair["prefill"].url + "/metrics", timeout=HTTP_TIMEOUT_S).text
    assert 'kind="unauthorized"' in metrics


def test_with_the_secret_prefill_pushes_the_kv_and_decode_streams_it(pair):
    r = requests.post(pair["prefill"].url + "/v1/prefill", json=_prefill_body(pair, "with-secret"), headers=GOOD,
                      timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 200, r.text
    assert r.json()["kv_bytes"] > 0  # the decode worker took the push: the prefill worker sent the secret on
    with requests.get(pair["decode"].url + "/v1/stream/with-secret", headers=GOOD, stream=True,
                      timeout=HTTP_TIMEOUT_S) as stream:
        events = read_stream(stream)
    assert events[-1]["type"] == "done" and events[-1]["completion_tokens"] == 4


def test_a_simulated_worker_checks_the_secret_too(simulated):
    body = {"prompt": "a b c", "max_tokens": 3}
    assert_openai_error(requests.post(simulated.url + "/v1/generate", json=body, timeout=HTTP_TIMEOUT_S), 401)
    assert_openai_error(requests.post(simulated.url + "/v1/generate", json=body, headers=WRONG,
                                      timeout=HTTP_TIMEOUT_S), 403)
    with requests.post(simulated.url + "/v1/generate", json=body, headers=GOOD, stream=True,
                       timeout=HTTP_TIMEOUT_S) as r:
        assert text(read_stream(r))
    assert requests.get(simulated.url + "/health", timeout=HTTP_TIMEOUT_S).json()["simulated"] is True


def test_a_worker_a_simulated_host_starts_holds_the_secret_it_was_given(tmp_path):
    host_port, worker_port = free_port(), free_port()
    host = start("simhost", ["-m", "inference.worker.sim_host", "--port", str(host_port)], tmp_path)
    try:
        wait_http(host, f"http://127.0.0.1:{host_port}/health", timeout=60)
        argv = ["--simulate", "tiny-cpu", "--role", "colocated", "--model", "/m/sim", "--port", str(worker_port)]
        r = requests.post(f"http://127.0.0.1:{host_port}/workers", json={"id": "w1", "argv": argv, "secret": SECRET},
                          timeout=HTTP_TIMEOUT_S)
        assert r.status_code == 200, r.text
        url = f"http://127.0.0.1:{worker_port}"
        body = {"prompt": "a b", "max_tokens": 2}
        assert requests.post(url + "/v1/generate", json=body, timeout=HTTP_TIMEOUT_S).status_code == 401
        assert requests.post(url + "/v1/generate", json=body, headers=GOOD, timeout=HTTP_TIMEOUT_S).status_code == 200
        refused = requests.post(f"http://127.0.0.1:{host_port}/workers", timeout=HTTP_TIMEOUT_S,
                                json={"id": "w2", "argv": argv, "secret": 7})
        assert refused.status_code == 400 and "secret" in refused.json()["error"]["message"]
    finally:
        host.stop()
