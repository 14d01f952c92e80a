"""A simulated worker is the real worker's server in front of a simulated engine: the server's rules (body limits,
duplicate ids, resumed requests, bad flags) hold for it as for a real one."""
from __future__ import annotations

import json

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
    proc = start_worker(tmp_path_factory.mktemp("sim-same"), "colocated", "colocated", "--max-body-bytes", "2048")
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


def test_a_bad_server_flag_is_refused_naming_it(tmp_path):
    import subprocess
    import sys

    from tests.procs import ROOT

    done = subprocess.run([sys.executable, "-m", "inference.worker", "--simulate", "tiny-cpu", "--role", "decode",
                           "--model", "m", "--port", "0", "--drain-timeout", "0"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--drain-timeout must be > 0" in done.stderr
