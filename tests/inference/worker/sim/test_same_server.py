"""A simulated worker is the real worker's server in front of a simulated engine: the server's rules (body limits,
duplicate ids, resumed requests, the test aids, the engine's health) hold for it as for a real one."""
from __future__ import annotations

import json
import time

import pytest
import requests

from tests.procs import free_port, start, wait_http

pytestmark = pytest.mark.integration

WORDS = ("sim", "tok", "alpha", "beta", "gamma", "delta", "echo", "fox", "golf", "hotel", "india", "juliet")


def start_worker(tmp_path, name: str, role: str, *flags: str):
    port = free_port()
    proc = start(name, ["-m", "inference.worker", "--simulate", "tiny-cpu", "--role", role, "--model", "/m/sim",
                        "--port", str(port), *flags], tmp_path)
    proc.url = f"http://127.0.0.1:{port}"
    wait_http(proc, proc.url + "/health", timeout=60)
    return proc


def ndjson(response: requests.Response) -> list[dict]:
    return [json.loads(line) for line in response.text.splitlines() if line]


@pytest.fixture(scope="module")
def colocated(tmp_path_factory):
    proc = start_worker(tmp_path_factory.mktemp("sim-same"), "colocated", "colocated", "--max-body-bytes", "2048",
                        "--enable-test-faults", "--stall-timeout", "1")
    yield proc
    proc.stop()


def test_a_body_over_the_limit_is_a_413(colocated):
    r = requests.post(colocated.url + "/v1/generate", json={"prompt": "x " * 2000}, timeout=10)
    assert r.status_code == 413 and r.json()["error"]["message"].startswith("request body")


def test_a_resumed_request_continues_the_words_where_it_stopped(colocated):
    r = requests.post(colocated.url + "/v1/generate", json={"prompt": "a b c", "max_tokens": 5,
                                                            "resume_token_ids": [0, 1]}, timeout=30)
    events = ndjson(r)
    text = "".join(e["text"] for e in events if e["type"] == "token")
    assert text.split() == ["alpha", "beta", "gamma"]
    assert events[0] == {"type": "start", "request_id": events[0]["request_id"], "prompt_tokens": 3}
    assert events[-1]["type"] == "done" and events[-1]["completion_tokens"] == 5


def wait_for_health(url: str, status: int, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        r = requests.get(url + "/health", timeout=5)
        if r.status_code == status:
            return r.json()
        assert time.monotonic() < deadline, f"/health stayed {r.status_code} {r.text}"
        time.sleep(0.1)


def test_a_stall_fault_makes_health_say_dead_until_it_ends(colocated):
    r = requests.post(colocated.url + "/debug/fault", json={"kind": "stall", "seconds": 4}, timeout=5)
    assert r.status_code == 200
    health = wait_for_health(colocated.url, 503)  # past --stall-timeout 1
    assert health["status"] == "dead" and "not ticked" in health["reason"] and health["simulated"] is True
    wait_for_health(colocated.url, 200)
    r = requests.post(colocated.url + "/v1/generate", json={"prompt": "x", "max_tokens": 2}, timeout=30)
    assert [e["type"] for e in ndjson(r)] == ["start", "token", "token", "done"]


def test_a_dead_engine_makes_health_503_and_fails_requests(tmp_path):
    proc = start_worker(tmp_path, "dies", "colocated", "--enable-test-faults")
    try:
        requests.post(proc.url + "/debug/fault", json={"kind": "die"}, timeout=5).raise_for_status()
        health = requests.get(proc.url + "/health", timeout=5)
        assert health.status_code == 503
        assert health.json()["status"] == "dead" and health.json()["simulated"] is True
        r = requests.post(proc.url + "/v1/generate", json={"prompt": "x"}, timeout=5)
        assert r.status_code == 503 and r.json()["error"]["code"] == "dead"
    finally:
        proc.stop()


def test_a_test_fault_error_worker_fails_requests_while_its_health_stays_ok(tmp_path):
    proc = start_worker(tmp_path, "faulty", "colocated", "--test-fault", "error")
    try:
        health = requests.get(proc.url + "/health", timeout=5).json()
        assert health["status"] == "ok" and health["test_fault"] == "error" and health["simulated"] is True
        r = requests.post(proc.url + "/v1/generate", json={"prompt": "x"}, timeout=5)
        assert r.status_code == 500 and r.json()["error"]["code"] == "test_fault"
    finally:
        proc.stop()


def test_a_bad_server_flag_is_refused_naming_it(tmp_path):
    import subprocess
    import sys

    from tests.procs import ROOT

    done = subprocess.run([sys.executable, "-m", "inference.worker", "--simulate", "tiny-cpu", "--role", "decode",
                           "--model", "m", "--port", "0", "--drain-timeout", "0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--drain-timeout must be > 0" in done.stderr
