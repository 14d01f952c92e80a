"""/health is 200 only while the model is loaded and the engine loop ticks; an engine failure fails its requests only.

The worker runs in the test process (inprocess.py) around the real engine wrapped in a test double, through which
each test holds the model load, fails a step, hangs the engine or kills its loop.
"""
from __future__ import annotations

import json
import threading

import pytest
import requests

from tests.inference.worker.inprocess import InProcessWorker, wait_for_status
from tests.inference.worker.support import HTTP_TIMEOUT_S, generate, metric, token_ids


@pytest.fixture(scope="module")
def worker(tiny_model_dir):
    proc = InProcessWorker("--role", "colocated", "--model", str(tiny_model_dir), "--threads", "1",
                           "--kv-cache-bytes", "8M", "--stall-timeout", "1", hold_load=True).start()
    yield proc
    proc.stop()


def health(url: str) -> requests.Response:
    return requests.get(f"{url}/health", timeout=HTTP_TIMEOUT_S)


def test_it_answers_503_starting_while_the_model_loads_then_200(worker):
    body = wait_for_status(worker.url, "starting")
    assert body["reason"] == "loading the model"
    assert health(worker.url).status_code == 503
    r = requests.post(f"{worker.url}/v1/generate", json={"prompt": "hi"}, timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 503 and r.json()["error"]["code"] == "starting"
    worker.wait_ready()
    body = health(worker.url).json()
    assert isinstance(body.pop("weight_bytes"), int)
    assert body == {"status": "ok", "role": "colocated", "model": "tiny", "revision": None, "dtype": "float32",
                    "kv_cache_dtype": "float32",
                    "max_model_len": 1024, "quantization": "none", "prefix_caching": True, "max_num_seqs": 64,
                    "batch_limit": 64,
                    "max_prompt_chars": 1024 * 64}  # the tiny tokenizer's longest token is 64 characters


def test_an_engine_step_error_fails_the_open_request_and_the_worker_goes_on(worker):
    worker.wait_ready()
    worker.engine.fail_steps = 1
    events = generate(worker.url, prompt="Hello", max_tokens=4)
    assert events[0]["type"] == "start"
    assert events[-1]["type"] == "error" and events[-1]["kind"] == "engine"
    assert "engine step failed: CUDA error" in events[-1]["message"]
    assert health(worker.url).status_code == 200
    assert len(token_ids(generate(worker.url, prompt="Hello", max_tokens=4))) == 4
    assert metric(worker.url, "tandem_request_errors_total", kind="engine") == 1
    assert metric(worker.url, "tandem_kv_cache_usage_ratio") == 0


def test_a_stuck_loop_reads_dead_and_fails_the_waiting_request_until_it_ticks_again(worker):
    worker.wait_ready()
    worker.engine.running.clear()  # the next step hangs; --stall-timeout is 1 s
    answer = {}
    thread = threading.Thread(target=lambda: answer.setdefault("events", generate(
        worker.url, prompt="Hello", max_tokens=4)))
    thread.start()
    try:
        body = wait_for_status(worker.url, "dead", timeout=30)
        assert "not ticked" in body["reason"]
        thread.join(30)
    finally:
        worker.engine.running.set()
    events = answer["events"]
    assert events[0]["type"] == "start" and events[-1]["type"] == "error", events
    assert "the engine stopped answering (dead" in events[-1]["message"]
    wait_for_status(worker.url, "ok", timeout=30)
    assert len(token_ids(generate(worker.url, prompt="Hello", max_tokens=4))) == 4


def test_a_dead_loop_fails_open_requests_and_reads_dead_while_http_still_answers(worker):
    worker.wait_ready()
    body = {"prompt": "Hello", "max_tokens": 1000, "ignore_eos": True}
    with requests.post(f"{worker.url}/v1/generate", json=body, stream=True, timeout=HTTP_TIMEOUT_S) as r:
        lines = r.iter_lines()
        assert json.loads(next(lines))["type"] == "start"
        assert json.loads(next(lines))["type"] == "token"
        worker.engine.dead = True
        last = [json.loads(line) for line in lines if line][-1]
    assert last["type"] == "error" and "the engine loop stopped" in last["message"]
    body = wait_for_status(worker.url, "dead", timeout=10)
    assert "engine loop died" in body["reason"] and "state is corrupt" in body["reason"]
    assert requests.get(f"{worker.url}/metrics", timeout=HTTP_TIMEOUT_S).status_code == 200
    r = requests.post(f"{worker.url}/v1/generate", json={"prompt": "hi"}, timeout=HTTP_TIMEOUT_S)
    assert r.status_code == 503 and r.json()["error"]["code"] == "dead"


def test_a_worker_that_compiles_says_so_while_it_starts(tiny_model_dir):
    # What the control plane reads to give it the warm-up's deadline (TANDEM_WARMUP_TIMEOUT_S), and the operator.
    from inference.worker.config import parse_args
    from inference.worker.server import WorkerServer
    from tests.procs import free_port

    server = WorkerServer(parse_args(["--role", "colocated", "--model", str(tiny_model_dir), "--compile",
                                      "--port", str(free_port())]), process_metrics=False)
    assert server.health_status() == ("starting", "loading the model, then compiling its decode step "
                                                  "(torch.compile warm-up)")
