"""The chaos fault proxy (controlplane/agent/fault_proxy.py) in front of a real simulated worker, as a node agent
runs it: an `error` fault answers every generation request (generate, prefill, the KV push, a decode stream) with a
500 before it reaches the worker, or a fraction of them; a `latency` fault delays each request and each streamed
line; /health, /info and /metrics pass through untouched meanwhile, as a failing engine still answers them; at its
deadline the faults stop by themselves and it stays a plain pass-through; SIGTERM makes it exit 0; a bad flag exits
2 naming it."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.procs import free_port, start, start_fault_proxy, wait_http

pytestmark = pytest.mark.integration

BODY = {"prompt": "a b c", "max_tokens": 4, "ignore_eos": True}


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("fault-proxy")
    port = free_port()
    proc = start("sim-worker", ["-m", "inference.worker", "--simulate", "tiny-cpu", "--role", "colocated", "--model",
                                "/m/sim", "--port", str(port)], log_dir)
    proc.url = f"http://127.0.0.1:{port}"
    proc.log_dir = log_dir
    try:
        wait_http(proc, proc.url + "/health", timeout=60)
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def proxies(worker):
    started = []

    def make(*flags: str, until: float | None = None):
        proxy = start_fault_proxy(f"proxy-{len(started)}", worker.url, worker.log_dir, *flags, until=until)
        started.append(proxy)
        return proxy

    yield make
    for proxy in started:
        proxy.stop()


def _answered(url: str) -> float:
    """Every request the worker counted, answered or failed."""
    text = requests.get(url + "/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name in ("tandem_request_success_total", "tandem_request_errors_total"))


def _events(response: requests.Response) -> list[dict]:
    return [json.loads(line) for line in response.text.splitlines() if line]


def test_an_error_fault_fails_every_generation_path_while_health_info_and_metrics_pass(worker, proxies):
    proxy = proxies("--error-ratio", "1")
    answered_before = _answered(worker.url)
    for method, path in (("POST", "/v1/generate"), ("POST", "/v1/prefill"), ("POST", "/v1/kv"),
                         ("GET", "/v1/stream/some-request")):
        r = requests.request(method, proxy.url + path, json=BODY, timeout=10)
        assert r.status_code == 500, (path, r.text)
        assert r.json()["error"]["code"] == "fault_injected" and "chaos fault proxy" in r.json()["error"]["message"]
    health = requests.get(proxy.url + "/health", timeout=10)
    assert health.status_code == 200 and health.json() == requests.get(worker.url + "/health", timeout=10).json()
    assert requests.get(proxy.url + "/info", timeout=10).json()["simulated"] is True
    assert "tandem_request_success_total" in requests.get(proxy.url + "/metrics", timeout=10).text
    assert _answered(worker.url) == answered_before  # none of the failed requests reached the worker


def test_an_error_ratio_fails_a_fraction_and_passes_the_rest_through(proxies):
    proxy = proxies("--error-ratio", "0.5")
    statuses = [requests.post(proxy.url + "/v1/generate", json=BODY, timeout=30) for _ in range(40)]
    codes = [r.status_code for r in statuses]
    assert set(codes) == {200, 500}, codes  # all alike: chance 2 in 2^40
    ok = next(r for r in statuses if r.status_code == 200)
    assert _events(ok)[-1]["type"] == "done" and _events(ok)[-1]["completion_tokens"] == 4


def test_a_latency_fault_delays_the_request_and_each_streamed_line_but_not_health(worker, proxies):
    proxy = proxies("--latency-ms", "300", "--line-latency-ms", "150")
    direct = _events(requests.post(worker.url + "/v1/generate", json=BODY, timeout=30))
    began = time.monotonic()
    with requests.post(proxy.url + "/v1/generate", json=BODY, stream=True, timeout=30) as r:
        lines = r.iter_lines()
        first = json.loads(next(lines))
        first_at = time.monotonic() - began
        # The event loop keeps answering while the stream crawls, and health is not delayed.
        health_began = time.monotonic()
        assert requests.get(proxy.url + "/health", timeout=10).status_code == 200
        assert time.monotonic() - health_began < 0.3
        rest = [json.loads(line) for line in lines if line]
    took = time.monotonic() - began
    events = [first, *rest]
    assert [e["type"] for e in events] == [e["type"] for e in direct]  # start, tokens, done: passed on as they came
    assert "".join(e.get("text", "") for e in events) == "".join(e.get("text", "") for e in direct)
    assert first_at >= 0.3 + 0.15
    assert took >= 0.3 + 0.15 * len(events), (took, len(events))


def test_the_faults_stop_at_the_deadline_by_themselves_and_sigterm_exits_0(proxies):
    proxy = proxies("--error-ratio", "1", until=time.time() + 10)
    assert requests.post(proxy.url + "/v1/generate", json=BODY, timeout=10).status_code == 500
    deadline = time.monotonic() + 20
    while requests.post(proxy.url + "/v1/generate", json=BODY, timeout=30).status_code != 200:
        assert time.monotonic() < deadline, "the faults outlived the proxy's deadline"
        time.sleep(0.2)
    assert proxy.alive()  # a plain pass-through from now on, told or not
    assert '"event": "deadline"' in proxy.log()
    proxy.popen.send_signal(signal.SIGTERM)
    assert proxy.popen.wait(30) == 0, proxy.log()
    assert '"event": "exit"' in proxy.log()


@pytest.mark.parametrize("flag,value", [("--error-ratio", "2"), ("--latency-ms", "-1")])
def test_a_bad_flag_exits_2_naming_it(flag, value):
    result = subprocess.run([sys.executable, "-m", "controlplane.agent.fault_proxy", "--upstream", "http://x:1",
                             "--port", "1", "--until", "0", flag, value], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and flag in result.stderr, result.stderr


def test_a_reset_fault_cuts_the_connection_without_an_answer(worker, proxies):
    proxy = proxies("--reset-ratio", "1")
    answered_before = _answered(worker.url)
    with pytest.raises(requests.ConnectionError):
        requests.post(proxy.url + "/v1/generate", json=BODY, timeout=10)
    assert requests.get(proxy.url + "/health", timeout=10).status_code == 200
    assert _answered(worker.url) == answered_before
