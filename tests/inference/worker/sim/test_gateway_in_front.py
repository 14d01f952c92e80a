"""A real gateway in front of simulated workers (`python -m inference.worker --simulate`), disaggregated and
colocated, streaming through the official openai client; the workers say everywhere that they are simulated."""
from __future__ import annotations

import openai
import pytest
import requests

from tests.inference.gateway.support import start_gateway, stop_all
from tests.procs import Proc, free_port, start, wait_http

pytestmark = pytest.mark.integration

WORDS = ("sim", "tok", "alpha", "beta", "gamma", "delta", "echo", "fox")


def start_simulated(specs: list[tuple[str, str]], log_dir, profile: str = "tiny-cpu") -> dict[str, Proc]:
    procs = {}
    for name, role in specs:
        port = free_port()
        proc = start(name, ["-m", "inference.worker", "--simulate", profile, "--role", role, "--model",
                            "/models/sim-model", "--port", str(port), "--revision", "3"], log_dir)
        proc.url = f"http://127.0.0.1:{port}"
        procs[name] = proc
    try:
        for proc in procs.values():
            wait_http(proc, proc.url + "/health", timeout=60)
    except BaseException:
        stop_all(list(procs.values()))
        raise
    return procs


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("sim-gateway")
    workers = start_simulated([("prefill", "prefill"), ("decode", "decode"), ("colocated", "colocated")], log_dir)
    gateways = {
        "disaggregated": start_gateway("gw-disagg", ["--prefill", workers["prefill"].url, "--decode",
                                                     workers["decode"].url, "--served-model-name", "sim"], log_dir),
        "colocated": start_gateway("gw-coloc", ["--colocated", workers["colocated"].url,
                                                "--served-model-name", "sim"], log_dir),
    }
    yield workers, gateways
    stop_all([*gateways.values(), *workers.values()])


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_a_streamed_completion_comes_through_the_gateway(fleet, mode):
    _, gateways = fleet
    client = openai.OpenAI(base_url=gateways[mode].url + "/v1", api_key="unused", max_retries=0, timeout=30)
    chunks = list(client.completions.create(model="sim", prompt="one two three four", max_tokens=7, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text.split() == [WORDS[i % len(WORDS)] for i in range(7)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.prompt_tokens == 4 and chunks[-1].usage.completion_tokens == 7


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_a_chat_completion_stops_at_a_stop_string(fleet, mode):
    _, gateways = fleet
    client = openai.OpenAI(base_url=gateways[mode].url + "/v1", api_key="unused", max_retries=0, timeout=30)
    result = client.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hello"}],
                                            max_tokens=20, stop=["gamma"])
    assert result.choices[0].finish_reason == "stop"
    assert result.choices[0].message.content.split() == ["sim", "tok", "alpha", "beta"]


def test_the_kv_handoff_crosses_from_prefill_to_decode_in_the_wire_format(fleet):
    workers, gateways = fleet
    before = _counter(workers["decode"].url, "tandem_kv_transfer_bytes_total")
    requests.post(gateways["disaggregated"].url + "/v1/completions",
                  json={"model": "sim", "prompt": "a b c d e f", "max_tokens": 3}, timeout=30).raise_for_status()
    received = _counter(workers["decode"].url, "tandem_kv_transfer_bytes_total") - before
    sent = _counter(workers["prefill"].url, "tandem_kv_transfer_bytes_total")
    assert received > 0 and sent >= received


def test_every_answer_says_it_is_simulated(fleet):
    workers, _ = fleet
    for name, proc in workers.items():
        health = requests.get(proc.url + "/health", timeout=5).json()
        info = requests.get(proc.url + "/info", timeout=5).json()
        assert health["status"] == "ok" and health["simulated"] is True and health["role"] == name
        assert health["model"] == "sim-model" and health["revision"] == "3"
        assert info["simulated"] is True and info["profile"] == "tiny-cpu" and info["kv_layout"]["dtype"] == "float32"
        metrics = requests.get(proc.url + "/metrics", timeout=5).text
        assert f'tandem_worker_simulated{{model="sim-model",profile="tiny-cpu",role="{name}"}} 1.0' in metrics
        assert "tandem_requests_running" in metrics and "tandem_worker_info" in metrics


def test_a_bad_request_gets_a_4xx_naming_the_field(fleet):
    workers, _ = fleet
    r = requests.post(workers["colocated"].url + "/v1/generate", json={"prompt": "x", "max_tokens": -1}, timeout=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = requests.post(workers["decode"].url + "/v1/kv", data=b"\x01\x00", timeout=5)
    assert r.status_code == 400 and "too short" in r.json()["error"]["message"]


def _counter(url: str, name: str) -> float:
    text = requests.get(url + "/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))
