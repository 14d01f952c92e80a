"""The chaos fault proxy (controlplane/agent/fault_proxy.py) in front of a real simulated worker, as a node agent
runs it: an `error` fault answers every generation request (generate, prefill, the KV push, a decode stream) with a
500 before it reaches the worker, or a fraction of them; a `latency` fault delays each request and each streamed
line; /health, /info and /metrics pass through untouched meanwhile, as a failing engine still answers them; at its
deadline the faults stop by themselves and it stays a plain pass-through; SIGTERM makes it exit 0; a bad flag exits
2 naming it. A `partition` holds every request, health too, unanswered until it heals; a `corrupt` fault flips
bytes of KV pushes, which a (simulated) decode worker refuses."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from inference.worker.sim.kv import encode_fake_payload
from tests.procs import free_port, start, start_fault_proxy, wait_http

pytestmark = pytest.mark.integration

BODY = {"prompt": "a b c", "max_tokens": 4, "ignore_eos": True}


def _sim_worker(tmp_path_factory, role: str):
    """A simulated worker of `role` (tiny-cpu profile) for the module; stopped at its end."""
    log_dir = tmp_path_factory.mktemp(f"fault-proxy-{role}")
    port = free_port()
    proc = start(f"sim-{role}", ["-m", "inference.worker", "--simulate", "tiny-cpu", "--role", role, "--model",
                                 "/m/sim", "--port", str(port)], log_dir)
    proc.url = f"http://127.0.0.1:{port}"
    proc.log_dir = log_dir
    try:
        wait_http(proc, proc.url + "/health", timeout=60)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    yield from _sim_worker(tmp_path_factory, "colocated")


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


@pytest.mark.parametrize("flag,value", [("--error-ratio", "2"), ("--latency-ms", "-1"), ("--corrupt-ratio", "1.5"),
                                        ("--corrupt-bytes", "0")])
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


def _listening_proxy(name: str, upstream_url: str, log_dir, *flags: str, until: float):
    """A fault proxy whose /health may not answer (a partition): waited for by a TCP connect."""
    port = free_port()
    proxy = start(name, ["-m", "controlplane.agent.fault_proxy", "--upstream", upstream_url, "--port", str(port),
                         "--until", f"{until:.3f}", "--drain-s", "0", *flags], log_dir)
    proxy.url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proxy
        except OSError:
            assert proxy.alive() and time.monotonic() < deadline, proxy.log()
            time.sleep(0.05)


def test_a_partition_holds_every_request_health_too_and_drops_it_when_it_heals(worker):
    """A client sees timeouts, not refusals; a request still held when the partition heals is dropped unanswered;
    after it, the proxy passes everything through."""
    until = time.time() + 6
    proxy = _listening_proxy("proxy-partition", worker.url, worker.log_dir, "--partition", until=until)
    try:
        answered_before = _answered(worker.url)
        for method, path in (("GET", "/health"), ("GET", "/metrics"), ("POST", "/v1/generate")):
            with pytest.raises(requests.Timeout):
                requests.request(method, proxy.url + path, json=BODY, timeout=1)
        with pytest.raises(requests.ConnectionError):  # held until the partition heals, then cut
            requests.post(proxy.url + "/v1/generate", json=BODY, timeout=30)
        assert time.time() >= until - 0.2
        assert requests.post(proxy.url + "/v1/generate", json=BODY, timeout=30).status_code == 200
        assert requests.get(proxy.url + "/health", timeout=10).status_code == 200
        assert _answered(worker.url) == answered_before + 1  # only the one sent after the partition
    finally:
        proxy.stop()
    assert '"partition": 4' in proxy.log(), proxy.log()


@pytest.fixture(scope="module")
def sim_decode(tmp_path_factory):
    yield from _sim_worker(tmp_path_factory, "decode")


def test_a_corrupt_fault_flips_bytes_of_the_kv_push_and_the_decode_worker_refuses_every_one(sim_decode):
    layout = requests.get(sim_decode.url + "/info", timeout=10).json()["kv_layout"]

    def push(url: str, request_id: str) -> requests.Response:
        header = {"request_id": request_id, "prompt_token_ids": list(range(1, 40)), "first_token_id": 5,
                  "sampling": {"max_tokens": 4}, "kv_layout": layout}
        return requests.post(url + "/v1/kv", data=encode_fake_payload(header, layout), timeout=30,
                             headers={"Content-Type": "application/octet-stream"})

    proxy = start_fault_proxy("proxy-corrupt", sim_decode.url, sim_decode.log_dir, "--corrupt-ratio", "1",
                              "--corrupt-bytes", "1")
    try:
        codes = []
        for number in range(20):
            refused = push(proxy.url, f"corrupt-{number}")
            assert refused.status_code == 400 and "bad KV payload" in refused.json()["error"]["message"], refused.text
            codes.append(refused.json()["error"]["code"])
        # Mostly in the tensor bytes (the bulk of a payload): the checksum names it; a flip in the framing is
        # refused by whatever it broke, never accepted.
        assert "kv_checksum_mismatch" in codes, codes
        assert requests.get(proxy.url + "/health", timeout=10).status_code == 200  # no body: untouched
        assert push(sim_decode.url, "intact").status_code == 200
    finally:
        proxy.stop()
    assert '"corrupt": 20' in proxy.log(), proxy.log()


def test_a_partition_after_a_delay_stalls_a_stream_in_flight_and_cuts_it_when_it_heals(worker):
    """Before it falls the proxy passes everything; when it falls a stream in flight stops mid-way (no line, no
    end) and is cut unfinished when the partition heals."""
    proxy = _listening_proxy("proxy-partition-later", worker.url, worker.log_dir, "--partition",
                             "--partition-after-s", "2", until=time.time() + 9)
    try:
        assert requests.get(proxy.url + "/health", timeout=10).status_code == 200
        arrivals = []
        with pytest.raises(requests.RequestException):
            with requests.post(proxy.url + "/v1/generate", json={**BODY, "max_tokens": 1500}, stream=True,
                               timeout=30) as r:
                for line in r.iter_lines():
                    if line:
                        arrivals.append((time.monotonic(), json.loads(line)["type"]))
        gaps = [later - earlier for (earlier, _), (later, _) in zip(arrivals, arrivals[1:])]
        assert arrivals and arrivals[-1][1] != "done"  # cut unfinished
        assert time.monotonic() - arrivals[-1][0] >= 3  # nothing passed while the partition lasted
        assert max(gaps, default=0) < 1  # and everything before it flowed
    finally:
        proxy.stop()
