"""Preemption, end to end: a real gateway with few admission slots (--max-outstanding-per-worker) in front of a real
simulated worker (deterministic: a request's tokens depend only on their position, so greedy output is comparable),
polling a stand-in control plane with tenants of each class. A waiting request that outranks a running one takes
its slot at once; the preempted stream pauses and resumes with every token exactly once, in order, as an
unpreempted run sends them; an interactive request is never preempted for a batch one; for a request of its own class,
a request is preempted at most --max-preemptions times, and not when it has fewer than --preempt-min-tokens-left
tokens left, while a request of a higher class preempts it whatever those bounds say."""
from __future__ import annotations

import hashlib
import json
import threading
import time

import pytest
import requests

from tests.inference.gateway.support import TOKEN, ControlPlane, start_gateway, stop_all
from tests.inference.worker.sim.test_gateway_in_front import start_simulated

pytestmark = pytest.mark.integration

TENANTS = {"bulk": "batch", "chat": "interactive", "a": "standard", "b": "standard"}
LONG_TOKENS = 1000
SHORT_TOKENS = 4
# Generous: the machine is shared, and a waiting request must not be shed while the test holds its slot.
SLOW = ["--queue-deadline", "interactive=300", "--queue-deadline", "standard=300", "--queue-deadline", "batch=300"]


def _key(tenant: str) -> str:
    return f"tk-{tenant}-0123456789"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("preemption")
    worker = start_simulated([("colocated", "colocated")], log_dir)["colocated"]
    control_plane = ControlPlane()
    control_plane.start()
    control_plane.endpoints.update({
        "groups": [{"revision": 3, "prefill": [], "decode": [], "colocated": [worker.url]}], "requires_key": True,
        "tenants": {name: {"class": cls, "limits": {}, "allowed": True,
                           "keys": [{"hash": hashlib.sha256(_key(name).encode()).hexdigest(), "expires_at": None}]}
                    for name, cls in TENANTS.items()}})
    gateways = []

    def gateway(slots: int, *flags: str):
        proc = start_gateway(f"gateway-{len(gateways)}", [
            "--control-plane", control_plane.url, "--deployment", "demo", "--token", TOKEN,
            "--max-outstanding-per-worker", str(slots), *SLOW, *flags], log_dir)
        gateways.append(proc)
        return proc

    yield gateway
    stop_all([*gateways, worker])
    control_plane.stop()


class Stream:
    """One streamed completion read on a thread: its text, tokens so far, first-token and end times."""

    def __init__(self, gateway, tenant: str, max_tokens: int) -> None:
        self.text, self.num_tokens, self.usage, self.error = [], 0, None, None
        self.first_token_at = self.finished_at = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(gateway, tenant, max_tokens), daemon=True)
        self._thread.start()

    def _run(self, gateway, tenant: str, max_tokens: int) -> None:
        try:
            with requests.post(gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {_key(tenant)}"},
                               json={"model": "demo", "prompt": "one two three", "max_tokens": max_tokens,
                                     "temperature": 0, "stream": True, "stream_options": {"include_usage": True}},
                               stream=True, timeout=300) as resp:
                assert resp.status_code == 200, resp.text
                for line in resp.iter_lines(decode_unicode=True):
                    if not line or not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[len("data: "):])
                    assert "error" not in chunk, chunk
                    if chunk.get("usage"):
                        self.usage = chunk["usage"]
                    for choice in chunk.get("choices") or ():
                        if choice.get("text"):
                            self.text.append(choice["text"])
                            self.num_tokens += 1
                            if self.first_token_at is None:
                                self.first_token_at = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported by result()
            self.error = exc
        finally:
            self.finished_at = time.monotonic()
            self.done.set()

    def result(self) -> str:
        assert self.done.wait(300), "the stream did not end"
        if self.error is not None:
            raise self.error
        return "".join(self.text)

    def wait_tokens(self, num: int) -> None:
        deadline = time.monotonic() + 120
        while self.num_tokens < num:
            assert not self.done.is_set(), f"the stream ended after {self.num_tokens} tokens"
            assert time.monotonic() < deadline, f"only {self.num_tokens} tokens after 120 s"
            time.sleep(0.01)


def _preemptions(gateway) -> dict[str, float]:
    counts = {}
    for line in requests.get(gateway.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("tandem_gateway_preemptions_total{"):
            tenant = line.split('tenant="', 1)[1].split('"', 1)[0]
            counts[tenant] = float(line.rsplit(" ", 1)[1])
    return counts


def _reference(gateway, tenant: str) -> str:
    return Stream(gateway, tenant, LONG_TOKENS).result()


def test_an_interactive_request_preempts_a_batch_stream_which_resumes_token_identically(fleet):
    gateway = fleet(1)
    reference = _reference(gateway, "bulk")
    bulk = Stream(gateway, "bulk", LONG_TOKENS)
    bulk.wait_tokens(20)
    chat = Stream(gateway, "chat", SHORT_TOKENS)
    chat.result()
    assert bulk.result() == reference  # every token once, in order, as the unpreempted run sent them
    assert bulk.usage["completion_tokens"] == LONG_TOKENS
    assert chat.finished_at < bulk.finished_at, "the interactive request waited for the batch stream to end"
    assert _preemptions(gateway) == {"bulk": 1.0}


def test_a_tenant_served_less_gets_a_slot_while_another_of_its_class_holds_them_all(fleet):
    gateway = fleet(2)
    reference = _reference(gateway, "a")
    streams = [Stream(gateway, "a", LONG_TOKENS) for _ in range(2)]
    for stream in streams:
        stream.wait_tokens(40)  # tenant a's counter is well past b's, which is lifted to a's at its last dispatch
    quiet = Stream(gateway, "b", SHORT_TOKENS)
    quiet.result()
    assert [s.result() for s in streams] == [reference, reference]
    assert quiet.finished_at < min(s.finished_at for s in streams)
    assert _preemptions(gateway) == {"a": 1.0}


def test_a_batch_request_never_preempts_an_interactive_one(fleet):
    gateway = fleet(1)
    chat = Stream(gateway, "chat", LONG_TOKENS)
    chat.wait_tokens(20)
    bulk = Stream(gateway, "bulk", SHORT_TOKENS)
    bulk.result()
    chat.result()
    assert bulk.first_token_at > chat.finished_at - 0.5  # it waited for the interactive stream (minus clock slack)
    assert bulk.first_token_at >= chat.first_token_at
    assert _preemptions(gateway) == {}


def test_a_stream_is_preempted_at_most_max_preemptions_times_for_its_own_class(fleet):
    gateway = fleet(1, "--max-preemptions", "1")
    reference = _reference(gateway, "a")
    stream = Stream(gateway, "a", LONG_TOKENS)
    stream.wait_tokens(40)  # tenant a's counter is well past b's
    Stream(gateway, "b", SHORT_TOKENS).result()
    resumed_at = stream.num_tokens
    stream.wait_tokens(resumed_at + 60)  # it runs again, and its counter gets past b's once more
    second = Stream(gateway, "b", SHORT_TOKENS)
    second.result()
    assert stream.result() == reference
    assert second.first_token_at > stream.finished_at - 0.5, "the stream was preempted a second time"
    assert _preemptions(gateway) == {"a": 1.0}


def test_a_stream_with_few_tokens_left_is_not_preempted_for_its_own_class(fleet):
    gateway = fleet(1, "--preempt-min-tokens-left", str(LONG_TOKENS + 1))
    stream = Stream(gateway, "a", LONG_TOKENS)
    stream.wait_tokens(40)
    quiet = Stream(gateway, "b", SHORT_TOKENS)
    quiet.result()
    stream.result()
    assert quiet.first_token_at > stream.finished_at - 0.5
    assert _preemptions(gateway) == {}


def test_an_interactive_request_preempts_a_batch_stream_whatever_the_bounds_say(fleet):
    """A preempted request goes back to the front of its queue and takes the next free slot: under a batch flood every
    slot soon holds a batch request preempted once already, which the bounds would let an interactive one wait for."""
    gateway = fleet(1, "--max-preemptions", "1", "--preempt-min-tokens-left", str(LONG_TOKENS + 1))
    reference = _reference(gateway, "bulk")
    bulk = Stream(gateway, "bulk", LONG_TOKENS)
    chats = []
    for _ in range(2):
        bulk.wait_tokens(bulk.num_tokens + 20)  # it runs (again)
        chats.append(Stream(gateway, "chat", SHORT_TOKENS))
        chats[-1].result()
    assert bulk.result() == reference
    assert all(chat.finished_at < bulk.finished_at for chat in chats), \
        "an interactive request waited for the batch stream to end"
    assert _preemptions(gateway) == {"bulk": 2.0}
