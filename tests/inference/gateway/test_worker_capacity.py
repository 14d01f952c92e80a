"""Admission slots come from the workers: each ready streaming worker counts the max_num_seqs its /health reports
plus --worker-capacity-headroom, at most --max-outstanding-per-worker, so that with the default flags a backlog waits
in the gateway's fair queue, not in the worker's FIFO. Router.capacity one state at a time, then a real gateway in
front of a real simulated worker."""
from __future__ import annotations

import threading
import time

import pytest
import requests

from inference.gateway.admission import DEFAULT_HEADROOM
from inference.gateway.config import Config, Mode, parse_args
from inference.gateway.routing import Router, WorkerState
from tests.inference.gateway.support import start_gateway, stop_all
from tests.procs import free_port, start, wait_http

URLS = ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


def _router(max_num_seqs: list[int | None], **config) -> Router:
    router = Router(Config(port=0, colocated_urls=URLS, **config))
    router.set_groups(Mode.COLOCATED, [{"revision": None, "colocated": URLS}])
    for worker, seqs in zip(router.workers, max_num_seqs):
        worker.state, worker.max_num_seqs = WorkerState.READY, seqs
    return router


def test_each_worker_counts_its_max_num_seqs_plus_the_headroom():
    assert _router([8, 16]).capacity() == 8 + 16 + 2 * DEFAULT_HEADROOM
    assert _router([8, 16], worker_capacity_headroom=0).capacity() == 24


def test_max_outstanding_per_worker_stays_an_upper_bound_and_counts_alone_for_a_silent_worker():
    assert _router([8, 300], max_outstanding_per_worker=100).capacity() == 8 + DEFAULT_HEADROOM + 100
    assert _router([None, 8]).capacity() == 256 + 8 + DEFAULT_HEADROOM


def test_a_worker_out_of_rotation_counts_nothing():
    router = _router([8, 16])
    router.workers[1].state = WorkerState.DOWN
    assert router.capacity() == 8 + DEFAULT_HEADROOM


def test_the_headroom_flag_defaults_and_refuses_a_negative_value(capsys):
    base = ["--port", "8080", "--colocated", URLS[0]]
    assert parse_args(base).worker_capacity_headroom == DEFAULT_HEADROOM
    assert parse_args([*base, "--worker-capacity-headroom", "0"]).worker_capacity_headroom == 0
    with pytest.raises(SystemExit):
        parse_args([*base, "--worker-capacity-headroom", "-1"])
    assert "--worker-capacity-headroom" in capsys.readouterr().err


def _metric(gateway_url: str, name: str) -> float:
    total = 0.0
    for line in requests.get(gateway_url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


@pytest.mark.integration
def test_with_default_flags_the_backlog_waits_at_the_gateway(tmp_path):
    port = free_port()
    # smollm2-cpu: a request of 50 tokens takes seconds, so the backlog stays while it is looked at.
    worker = start("sim-colocated", ["-m", "inference.worker", "--simulate", "smollm2-cpu", "--role", "colocated",
                                     "--model", "/models/sim-model", "--port", str(port), "--max-num-seqs", "2"],
                   tmp_path)
    procs = [worker]
    try:
        worker_url = f"http://127.0.0.1:{port}"
        wait_http(worker, worker_url + "/health", timeout=60)
        assert requests.get(worker_url + "/health", timeout=10).json()["max_num_seqs"] == 2
        gateway = start_gateway("gateway", ["--colocated", worker_url, "--worker-capacity-headroom", "1"], tmp_path)
        procs.insert(0, gateway)
        assert _metric(gateway.url, "tandem_gateway_admission_capacity") == 3
        statuses = []

        def send() -> None:
            statuses.append(requests.post(gateway.url + "/v1/completions", timeout=120, json={
                "model": "tandem", "prompt": "one two three", "max_tokens": 50}).status_code)

        threads = [threading.Thread(target=send) for _ in range(6)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while _metric(gateway.url, "tandem_gateway_queue_length") < 3:  # 3 run (2 + headroom 1), 3 wait here
            assert time.monotonic() < deadline, "no backlog formed at the gateway"
            time.sleep(0.05)
        assert _metric(gateway.url, "tandem_gateway_admission_running") == 3
        for thread in threads:
            thread.join(120)
        assert statuses == [200] * 6
    finally:
        stop_all(procs)
