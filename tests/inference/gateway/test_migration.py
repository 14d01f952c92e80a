"""A decode (or colocated) worker killed with SIGKILL mid-stream: the gateway continues each of its requests on
another ready worker pair of the same revision, and the client sees a pause, not an error. Greedy output, finish
reason and usage equal those of an undisturbed run, stop strings included, streaming or not.

Which worker serves a request is read from the gateway's /health (outstanding requests per worker). That worker is
stopped by the OS (SIGSTOP) before it is killed, so its requests are surely mid-stream."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests.inference.gateway.support import (
    PLAIN_FLEET, restart, shared_workers, start_gateway, start_workers, stop_all, worker_states)
from tests.inference.worker.support import metric

# Module fixtures start six worker processes; on a loaded host that alone can take minutes (counted in the first
# test's time), so give the module room beyond the 300 s default.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

TIMEOUT_S = 120
PROMPTS = ["Once upon a time", "Permission is hereby granted", "The quick brown fox", "In the beginning",
           "It was a dark and stormy night", "Call me Ishmael", "All happy families", "To be or not to be"]


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    """Two decode and two colocated workers of this module's own (it kills them), the shared prefill worker,
    and gateways in front of them."""
    shared = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)
    log_dir = tmp_path_factory.mktemp("gateway-migration")
    workers = dict(zip(("decode-1", "decode-2", "colocated-1", "colocated-2"), start_workers(
        [("decode-1", "decode"), ("decode-2", "decode"), ("colocated-1", "colocated"), ("colocated-2", "colocated")],
        tiny_model_dir, log_dir)))
    decode_urls = f"{workers['decode-1'].url},{workers['decode-2'].url}"
    colocated_urls = f"{workers['colocated-1'].url},{workers['colocated-2'].url}"
    state = {"workers": workers, "gateways": {}}
    try:
        for name, flags in [("disaggregated", ["--prefill", shared["prefill"].url, "--decode", decode_urls]),
                            ("colocated", ["--colocated", colocated_urls]),
                            ("no-migration", ["--colocated", colocated_urls, "--max-migrations", "0"])]:
            state["gateways"][name] = start_gateway(f"gateway-{name}", flags, log_dir)
        yield state
    finally:  # workers killed and restarted by the tests are in `state` too
        stop_all([*state["gateways"].values(), *state["workers"].values()])


@pytest.fixture
def gateways(fleet):
    """The gateways, once every worker is alive again and back in their rotation."""
    workers = fleet["workers"]
    for name, proc in list(workers.items()):
        if not proc.alive():
            workers[name] = restart(proc)
    deadline = time.monotonic() + TIMEOUT_S
    for gateway in fleet["gateways"].values():
        while not all(state == "ready" and outstanding == 0
                      for state, outstanding in worker_states(gateway.url).values()):
            assert time.monotonic() < deadline, worker_states(gateway.url)
            time.sleep(0.1)
    return fleet["gateways"]


class Client(threading.Thread):
    """One request through the gateway on its own thread; `events` fill in as they arrive."""

    def __init__(self, url: str, body: dict, chat: bool = False) -> None:
        super().__init__(daemon=True)
        self.url = url + ("/v1/chat/completions" if chat else "/v1/completions")
        self.body = body
        self.events: list = []
        self.times: list[float] = []  # when each event came
        self.answer: requests.Response | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with requests.post(self.url, json=self.body, stream=self.body.get("stream", False),
                               timeout=TIMEOUT_S) as resp:
                self.answer = resp
                if not self.body.get("stream"):
                    resp.content
                    return
                for line in resp.iter_lines(decode_unicode=True):
                    if line.startswith("data: "):
                        payload = line.removeprefix("data: ")
                        self.events.append(payload if payload == "[DONE]" else json.loads(payload))
                        self.times.append(time.monotonic())
        except BaseException as exc:  # reported by the test thread
            self.error = exc

    def result(self) -> dict:
        """text, finish_reason and usage, from the SSE chunks or the JSON answer; asserts it succeeded."""
        self.join(TIMEOUT_S)
        assert not self.is_alive() and self.error is None, self.error
        assert self.answer.status_code == 200, self.answer.text
        if not self.body.get("stream"):
            choice = self.answer.json()["choices"][0]
            return {"text": choice.get("text", (choice.get("message") or {}).get("content")),
                    "finish_reason": choice["finish_reason"], "usage": self.answer.json()["usage"]}
        assert self.events and self.events[-1] == "[DONE]", self.events[-3:]
        chunks = self.events[:-1]
        errors = [c["error"] for c in chunks if "error" in c]
        assert not errors, errors
        text = "".join((c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or "")
                       for c in chunks if c.get("choices"))
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")][-1]
        usage = [c["usage"] for c in chunks if c.get("usage")]
        return {"text": text, "finish_reason": finish, "usage": usage[-1] if usage else None}


def _body(prompt: str, **extra) -> dict:
    return {"model": "tandem", "prompt": prompt, "max_tokens": 400, "temperature": 0, "ignore_eos": True, **extra}


def _run(url: str, bodies: list[dict], chat: bool = False) -> list[dict]:
    clients = [Client(url, body, chat) for body in bodies]
    for client in clients:
        client.start()
    return [client.result() for client in clients]


def _migrations(gateway_url: str) -> float:
    text = requests.get(gateway_url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text) if f.name == "tandem_request_migrations"
               for s in f.samples if s.name.endswith("_total"))


def _kill_a_busy_worker(gateway_url: str, workers: dict, candidates: list[str], started) -> int:
    """Once `started()` holds, stop (SIGSTOP) then SIGKILL the candidate worker holding the most requests; return
    how many it held (its requests cannot finish while it is stopped, so each was cut mid-stream)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not started():
        assert time.monotonic() < deadline, "the requests never started"
        time.sleep(0.01)
    by_url = {workers[name].url: workers[name] for name in candidates}
    busiest = max(by_url, key=lambda url: worker_states(gateway_url)[url][1])
    os.kill(by_url[busiest].popen.pid, signal.SIGSTOP)
    num_held = worker_states(gateway_url)[busiest][1]
    by_url[busiest].kill9()
    return num_held


def _stop_string(text: str) -> str:
    """Four characters that first occur three quarters into `text`: text before them is held back while streaming."""
    for start in range(3 * len(text) // 4, len(text) - 4):
        stop = text[start:start + 4]
        if text.find(stop) == start and stop.strip():
            return stop
    raise AssertionError(f"no stop string in {text!r}")


def test_eight_concurrent_streams_survive_a_killed_decode_worker_token_for_token(gateways, fleet):
    gateway = gateways["disaggregated"]
    bodies = [_body(prompt, stream=True, stream_options={"include_usage": True}) for prompt in PROMPTS]
    undisturbed = _run(gateway.url, bodies)
    migrations_before = _migrations(gateway.url)

    clients = [Client(gateway.url, body) for body in bodies]
    for client in clients:
        client.start()
    num_cut = _kill_a_busy_worker(gateway.url, fleet["workers"], ["decode-1", "decode-2"],
                                  lambda: all(len(c.events) >= 2 for c in clients))
    assert num_cut >= 1
    assert [c.result() for c in clients] == undisturbed
    # Each request cut on the killed worker moved once (the other decode worker was ready all along).
    assert 1 <= _migrations(gateway.url) - migrations_before <= num_cut


def _num_generated(workers: dict, names: list[str]) -> float:
    return sum(metric(workers[name].url, "tandem_generation_tokens_total") for name in names)


# Each answer shape once, and each mode (a killed worker is restarted by the next test: ~10 s a case).
@pytest.mark.parametrize("mode, kind", [("disaggregated", "stream"), ("colocated", "json"),
                                        ("colocated", "chat")])
def test_a_request_cut_mid_way_ends_as_if_undisturbed(gateways, fleet, mode, kind):
    gateway, workers = gateways[mode], fleet["workers"]
    # A stop string late in the output: while streaming, the text before it is held back, also at the seam.
    stop = _stop_string(_run(gateway.url, [_body(PROMPTS[0])])[0]["text"])
    body = _body(PROMPTS[0], stop=[stop], stream=kind != "json")
    if kind == "stream":
        body["stream_options"] = {"include_usage": True}
    if kind == "chat":
        prompt = body.pop("prompt")  # a chat request has messages only (the gateway refuses fields it does not know)
        body = {**body, "messages": [{"role": "user", "content": prompt}]}
    (undisturbed,) = _run(gateway.url, [body], chat=kind == "chat")
    assert undisturbed["finish_reason"] == "stop" or kind == "chat"

    client = Client(gateway.url, body, chat=kind == "chat")
    candidates = ["decode-1", "decode-2"] if mode == "disaggregated" else ["colocated-1", "colocated-2"]
    generated_before = _num_generated(workers, candidates)
    client.start()
    # A few tokens generated: past the first token, where only a migration can save the request.
    assert _kill_a_busy_worker(gateway.url, workers, candidates,
                               lambda: _num_generated(workers, candidates) >= generated_before + 5) == 1
    assert client.result() == undisturbed
    assert _migrations(gateway.url) >= 1


def test_with_max_migrations_0_a_cut_stream_ends_with_an_error_event_then_done(gateways, fleet):
    gateway = gateways["no-migration"]
    client = Client(gateway.url, _body(PROMPTS[0], stream=True))
    client.start()
    _kill_a_busy_worker(gateway.url, fleet["workers"], ["colocated-1", "colocated-2"], lambda: len(client.events) >= 2)
    client.join(TIMEOUT_S)
    assert client.answer.status_code == 200 and client.events[-1] == "[DONE]"
    error = client.events[-2]["error"]
    assert error["type"] == "upstream_error" and "broke" in error["message"]
    assert _migrations(gateway.url) == 0


def test_streams_on_a_hung_decode_worker_move_once_the_gateway_ejects_it(gateways, fleet):
    """SIGSTOP (from the OS, as a frozen host would) the decode worker holding the most streams: nothing closes its
    connections, so its streams go on only because the gateway moves them when its health probes take it out of
    rotation (every 1 s, 1 s timeout, 2 in a row), not when something finally kills it."""
    gateway, workers = gateways["disaggregated"], fleet["workers"]
    bodies = [_body(prompt, stream=True, stream_options={"include_usage": True}) for prompt in PROMPTS[:4]]
    undisturbed = _run(gateway.url, bodies)
    clients = [Client(gateway.url, body) for body in bodies]
    for client in clients:
        client.start()
    deadline = time.monotonic() + TIMEOUT_S
    while not all(len(c.events) >= 2 for c in clients):
        assert time.monotonic() < deadline, "the requests never started"
        time.sleep(0.01)
    by_url = {workers[name].url: workers[name] for name in ("decode-1", "decode-2")}
    busiest = max(by_url, key=lambda url: worker_states(gateway.url)[url][1])
    hung = by_url[busiest]
    stopped_at = time.monotonic()
    os.kill(hung.popen.pid, signal.SIGSTOP)
    try:
        results = [c.result() for c in clients]
    finally:
        os.kill(hung.popen.pid, signal.SIGCONT)
    assert results == undisturbed
    # The longest wait of any stream across the stop: the probes' ~2-3 s and a new prefill, with room for a
    # loaded host; a stream that waited for the worker to come back would still wait (it is only woken below).
    gaps = [max(b - a for a, b in zip(c.times, c.times[1:]) if b > stopped_at) for c in clients]
    assert max(gaps) < 20, gaps
    assert _migrations(gateway.url) >= 1

