"""SIGTERM drains: new requests get 503, /health says draining, open requests finish, then the process exits 0."""
from __future__ import annotations

import json
import signal

import pytest
import requests

from inference.worker.sim_profile import BUILTIN
from tests.inference.worker.support import HTTP_TIMEOUT_S, START_TIMEOUT_S, assert_openai_error, start_worker
from tests.procs import wait_http

pytestmark = pytest.mark.integration

NUM_TOKENS = 200


@pytest.fixture(scope="module")
def workers(tiny_model_dir, tmp_path_factory):
    """Two workers, each for one SIGTERM; started together so that their model loads overlap."""
    log_dir = tmp_path_factory.mktemp("logs")
    # The patient one is the same server in front of a simulated engine whose decode step takes 50 ms (200 tokens:
    # 10 s), so its open request surely outlasts the test's checks on a loaded host; the tiny model alone would
    # finish it in about a second.
    profile = json.loads(json.dumps(BUILTIN["tiny-cpu"]))
    profile["roles"]["colocated"]["decode"] = {"a": 0.05}
    (log_dir / "patient.json").write_text(json.dumps({**profile, "name": "patient"}))
    started = {"patient": start_worker("patient", "colocated", tiny_model_dir, log_dir,
                                       "--simulate", str(log_dir / "patient.json"), wait=False),
               "hasty": start_worker("hasty", "colocated", tiny_model_dir, log_dir, "--drain-timeout", "0.5",
                                     wait=False)}
    try:
        for proc in started.values():
            wait_http(proc, f"{proc.url}/health", timeout=START_TIMEOUT_S)
        yield started
    finally:
        for proc in started.values():
            proc.kill9()


def test_sigterm_lets_the_open_request_finish_and_exits_0(workers):
    worker = workers["patient"]
    body = {"prompt": "Once upon a time", "max_tokens": NUM_TOKENS, "ignore_eos": True}
    with requests.post(f"{worker.url}/v1/generate", json=body, stream=True, timeout=HTTP_TIMEOUT_S) as r:
        assert r.status_code == 200, r.text
        lines = r.iter_lines()
        assert json.loads(next(lines))["type"] == "start"
        assert json.loads(next(lines))["type"] == "token"
        worker.popen.send_signal(signal.SIGTERM)

        health = requests.get(f"{worker.url}/health", timeout=HTTP_TIMEOUT_S)
        assert health.status_code == 503 and health.json()["status"] == "draining"
        refused = requests.post(f"{worker.url}/v1/generate", json={"prompt": "hi"}, timeout=HTTP_TIMEOUT_S)
        assert_openai_error(refused, 503, "draining")
        assert refused.headers["Retry-After"]

        events = [json.loads(line) for line in lines if line]
    assert events[-1] == {"type": "done", "finish_reason": "length", "prompt_tokens": events[-1]["prompt_tokens"],
                          "completion_tokens": NUM_TOKENS}
    assert sum(len(e["token_ids"]) for e in events if e["type"] == "token") == NUM_TOKENS - 1
    assert worker.popen.wait(30) == 0, worker.log()
    assert "exit 0" in worker.log()


def test_a_request_that_outlives_the_drain_timeout_is_ended_with_an_error_and_the_exit_is_still_0(workers):
    worker = workers["hasty"]
    body = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True}
    with requests.post(f"{worker.url}/v1/generate", json=body, stream=True, timeout=HTTP_TIMEOUT_S) as r:
        lines = r.iter_lines()
        assert json.loads(next(lines))["type"] == "start"
        worker.popen.send_signal(signal.SIGTERM)
        events = [json.loads(line) for line in lines if line]
    assert events[-1]["type"] == "error" and events[-1]["kind"] == "drain"
    assert worker.popen.wait(30) == 0, worker.log()
