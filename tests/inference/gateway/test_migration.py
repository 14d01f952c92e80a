"""A decode (or colocated) worker killed with SIGKILL mid-stream: the gateway continues each of its requests on
another ready worker pair of the same revision, and the client sees a pause, not an error. Greedy output, finish
reason and usage equal those of an undisturbed run, stop strings included, streaming or not.

Which worker serves a request is read from the gateway's /health (outstanding requests per worker). That worker is
stopped by the OS (SIGSTOP) before it is killed, so its requests are surely mid-stream.

A killed worker is started again as soon as its test ends, and each test waits only for the workers behind its own
gateway: the tests alternate between the decode pair and the colocated pair, so one pair's restart (~7 s of torch
import and model load) overlaps a test on the other. The undisturbed runs, greedy and deterministic, are made once
per gateway and body and reused by the tests that compare against the same ones."""
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
# A restarted worker's start (as restart()'s own wait allows) and the gateway's probes taking it back.
RESTART_TIMEOUT_S = 180 + TIMEOUT_S
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
    state = {"workers": workers, "gateways": {}, "undisturbed": {}}
    try:
        for name, flags in [("disaggregated", ["--prefill", shared["prefill"].url, "--decode", decode_urls]),
                            ("colocated", ["--colocated", colocated_urls]),
                            ("no-migration", ["--colocated", colocated_urls, "--max-migrations", "0"])]:
            state["gateways"][name] = start_gateway(f"gateway-{name}", flags, log_dir)
        yield state
    finally:  # workers killed and restarted by the tests are in `state` too
        stop_all([*state["gateways"].values(), *state["workers"].values()])


@pytest.fixture
def ready(fleet):
    """ready(mode): the gateway `mode`, once every worker behind it is back in its rotation with nothing outstanding.
    Workers a test killed are started again when it ends, without waiting: the next test waits only for its own."""
    workers = fleet["workers"]

    def wait(mode: str):
        gateway = fleet["gateways"][mode]
        deadline = time.monotonic() + RESTART_TIMEOUT_S
        while not all(state == "ready" and outstanding == 0
                      for state, outstanding in worker_states(gateway.url).values()):
            dead = [proc for proc in workers.values() if not proc.alive()]  # a restart that failed
            assert not dead, f"{dead[0].name} exited with {dead[0].popen.returncode}:\n{dead[0].log()}"
            assert time.monotonic() < deadline, worker_states(gateway.url)
            time.sleep(0.1)
        return gateway

    yield wait
    for name, proc in list(workers.items()):
        if not proc.alive():
            workers[name] = restart(proc, wait=False)


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


def _undisturbed(fleet: dict, mode: str, bodies: list[dict], chat: bool = False) -> list[dict]:
    """What `bodies` give through gateway `mode` with no worker disturbed: each run once (greedy: the same every
    time, whichever worker of the pair serves it), then read from the module's record."""
    record = fleet["undisturbed"]
    keys = [(mode, chat, json.dumps(body, sort_keys=True)) for body in bodies]
    missing = {key: body for key, body in zip(keys, bodies) if key not in record}
    record.update(zip(missing, _run(fleet["gateways"][mode].url, list(missing.values()), chat)))
    return [record[key] for key in keys]


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


def test_eight_concurrent_streams_survive_a_killed_decode_worker_token_for_token(ready, fleet):
    gateway = ready("disaggregated")
    bodies = [_body(prompt, stream=True, stream_options={"include_usage": True}) for prompt in PROMPTS]
    undisturbed = _undisturbed(fleet, "disaggregated", bodies)
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


# Each answer shape once, and each mode (a killed worker is restarted while the next case runs on the other pair).
@pytest.mark.parametrize("mode, kind", [("colocated", "json"), ("disaggregated", "stream"),
                                        ("colocated", "chat")])
def test_a_request_cut_mid_way_ends_as_if_undisturbed(ready, fleet, mode, kind):
    gateway, workers = ready(mode), fleet["workers"]
    # A stop string late in the output: while streaming, the text before it is held back, also at the seam.
    stop = _stop_string(_undisturbed(fleet, mode, [_body(PROMPTS[0])])[0]["text"])
    body = _body(PROMPTS[0], stop=[stop], stream=kind != "json")
    if kind == "stream":
        body["stream_options"] = {"include_usage": True}
    if kind == "chat":
        prompt = body.pop("prompt")  # a chat request has messages only (the gateway refuses fields it does not know)
        body = {**body, "messages": [{"role": "user", "content": prompt}]}
    (undisturbed,) = _undisturbed(fleet, mode, [body], chat=kind == "chat")
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


def test_streams_on_a_hung_decode_worker_move_once_the_gateway_ejects_it(ready, fleet):
    """SIGSTOP (from the OS, as a frozen host would) the decode worker holding the most streams: nothing closes its
    connections, so its streams go on only because the gateway moves them when its health probes take it out of
    rotation (every 1 s, 1 s timeout, 2 in a row), not when something finally kills it."""
    gateway, workers = ready("disaggregated"), fleet["workers"]
    bodies = [_body(prompt, stream=True, stream_options={"include_usage": True}) for prompt in PROMPTS[:4]]
    undisturbed = _undisturbed(fleet, "disaggregated", bodies)
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


def test_with_max_migrations_0_a_cut_stream_ends_with_an_error_event_then_done(ready, fleet):
    gateway = ready("no-migration")
    client = Client(gateway.url, _body(PROMPTS[0], stream=True))
    client.start()
    _kill_a_busy_worker(gateway.url, fleet["workers"], ["colocated-1", "colocated-2"], lambda: len(client.events) >= 2)
    client.join(TIMEOUT_S)
    assert client.answer.status_code == 200 and client.events[-1] == "[DONE]"
    error = client.events[-2]["error"]
    assert error["type"] == "upstream_error" and "broke" in error["message"]
    assert _migrations(gateway.url) == 0
