"""The deployment's ITL objective bounds the workers' decode batch: the control plane's membership answer carries it,
the gateway sends it with each request, the worker fits its decode steps and admits no more sequences than keep a
step within it (its /health `batch_limit`), and the gateway sizes its admission slots by that, so the backlog waits
in the gateway's fair queue. Here on a real tiny-model worker, behind a real gateway and a stand-in control plane,
with an objective no step can meet: one sequence at a time, and every request still served."""
from __future__ import annotations

import threading
import time

import pytest
import requests

from inference.gateway.admission import DEFAULT_HEADROOM
from inference.worker.protocol import GenerateRequest, RequestError, parse_scheduling
from tests.inference.gateway.support import TOKEN, ControlPlane, start_gateway, stop_all
from tests.inference.worker.support import assert_openai_error, metric, start_worker

pytestmark = pytest.mark.integration

NUM_REQUESTS = 6
MAX_NUM_SEQS = 8


def _burst(gateway_url: str, results: list) -> list[threading.Thread]:
    def send() -> None:
        r = requests.post(gateway_url + "/v1/completions", timeout=120, json={
            "model": "demo", "prompt": "one two three four", "max_tokens": 24, "ignore_eos": True})
        results.append((r.status_code, r.json()["usage"]["completion_tokens"] if r.status_code == 200 else r.text))

    threads = [threading.Thread(target=send) for _ in range(NUM_REQUESTS)]
    for thread in threads:
        thread.start()
    return threads


def test_an_objective_no_step_meets_runs_one_sequence_at_a_time_and_loses_nothing(tiny_model_dir, tmp_path):
    worker = start_worker("itl-worker", "colocated", tiny_model_dir, tmp_path, "--max-num-seqs", str(MAX_NUM_SEQS))
    control_plane = ControlPlane()
    control_plane.endpoints.update({"groups": [{"revision": 1, "colocated": [worker.url]}],
                                    "objectives": {"itl_p99_seconds": 0.0001}})
    control_plane.start()
    procs = [worker]
    try:
        gateway = start_gateway("itl-gateway", ["--control-plane", control_plane.url, "--deployment", "demo",
                                                "--token", TOKEN], tmp_path)
        procs.insert(0, gateway)
        assert requests.get(worker.url + "/health", timeout=10).json()["batch_limit"] == MAX_NUM_SEQS
        results: list = []
        # The first burst runs unbounded (no step measured yet) and teaches the worker what a step costs.
        for thread in _burst(gateway.url, results):
            thread.join(120)
        deadline = time.monotonic() + 30
        while (requests.get(worker.url + "/health", timeout=10).json()["batch_limit"] != 1
               or metric(gateway.url, "tandem_gateway_admission_capacity") != 1 + DEFAULT_HEADROOM):
            assert time.monotonic() < deadline, "the batch limit did not reach the worker's /health and the gateway"
            time.sleep(0.05)
        assert metric(worker.url, "tandem_batch_limit") == 1
        threads = _burst(gateway.url, results)
        most_running = 0
        while any(thread.is_alive() for thread in threads):
            most_running = max(most_running, metric(worker.url, "tandem_requests_running"))
        assert most_running == 1
        assert results == [(200, 24)] * (2 * NUM_REQUESTS)

        # The worker's own edge: a bad objective is a 400 naming the field.
        bad = requests.post(worker.url + "/v1/generate", timeout=30,
                            json={"prompt": "x", "max_tokens": 2, "itl_target_s": "fast"})
        assert_openai_error(bad, 400, "itl_target_s")
    finally:
        stop_all(procs)
        control_plane.stop()


def test_the_kv_header_carries_the_band_tenant_and_objective_to_the_decode_worker():
    req = GenerateRequest(request_id="r", prompt="x", messages=None, params=None, stop=[], priority=0,
                          cache_salt=bytes(range(16)), itl_target_s=0.25)
    assert parse_scheduling(req.scheduling_header()) == (0, bytes(range(16)), 0.25)
    assert parse_scheduling(None) == (1, b"", None)  # from a prefill worker that predates it
    with pytest.raises(RequestError, match="scheduling.tenant"):
        parse_scheduling({"tenant": "not hex"})
