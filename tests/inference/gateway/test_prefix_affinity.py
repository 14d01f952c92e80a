"""Two real colocated workers (tiny model, prefix caching on) behind a real gateway: requests that begin alike go to
one worker and find their prefix cached there, a chat's turns stay on one worker, distinct prefixes spread over
both, and a home worker loaded above the bound spills to the next one on the ring. Where each request ran is read
from the workers' own /metrics; the gateway's decisions from its tandem_gateway_prefix_routing_total."""
from __future__ import annotations

import threading

import pytest
import requests

from tests.inference.gateway.support import (
    PLAIN_FLEET, complete, shared_workers, start_gateway, start_workers, stop_all)
from tests.inference.worker.support import metric
from tests.procs import start_fault_proxy, wait_http

pytestmark = pytest.mark.integration

# A fault proxy in front of each worker (a chaos `latency` fault, as a node agent starts it) holds each streamed token
# 0.2 s, so that a streaming request stays outstanding at the gateway a while.
SLOW = ["--line-latency-ms", "200"]
SYSTEM = ("You are a careful assistant for a bakery. Answer questions about bread, opening hours and orders. "
          "Keep answers short, polite and factual; never invent prices that are not listed in the menu. ") * 2


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    """The session's shared plain colocated worker and one of this module's own (the tests read only the deltas of
    the workers' counters, and use prompts no other module sends), each behind a fault proxy, and the gateway."""
    log_dir = tmp_path_factory.mktemp("gateway-prefix-affinity")
    shared = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)["colocated"]
    own = start_workers([("b", "colocated")], tiny_model_dir, log_dir)
    workers = [shared, *own]
    procs = list(own)
    try:
        proxies = [start_fault_proxy(f"proxy-{w.name}", w.url, log_dir, *SLOW, wait=False) for w in workers]
        procs += proxies
        for proxy in proxies:
            wait_http(proxy, proxy.url + "/health", timeout=30)
        gateway = start_gateway("gateway", ["--colocated", ",".join(p.url for p in proxies)], log_dir)
        procs.append(gateway)
        yield gateway, workers
    finally:
        stop_all(procs)


def served(workers) -> list[float]:
    return [metric(w.url, "tandem_request_success_total") for w in workers]


def hits(workers) -> list[float]:
    return [metric(w.url, "tandem_prefix_cache_hit_tokens_total") for w in workers]


def decisions(gateway) -> dict[str, float]:
    return {d: metric(gateway.url, "tandem_gateway_prefix_routing_total", stage="colocated", decision=d)
            for d in ("affinity", "spilled")}


def delta(after, before):
    return [a - b for a, b in zip(after, before)]


def test_requests_sharing_a_long_prefix_go_to_one_worker_and_hit_its_cache(fleet):
    gateway, workers = fleet
    served0, hits0, decisions0 = served(workers), hits(workers), decisions(gateway)
    for i in range(5):
        r = complete(gateway.url, {"model": "tandem", "prompt": SYSTEM + f"Question {i}: do you bake rye?",
                                   "max_tokens": 2, "temperature": 0})
        assert r.status_code == 200, r.text
    per_worker = delta(served(workers), served0)
    assert sorted(per_worker) == [0, 5]
    home = per_worker.index(5)
    assert delta(hits(workers), hits0)[home] > 4 * 16  # requests 2-5 found the shared head's blocks
    assert delta(list(decisions(gateway).values()), list(decisions0.values())) == [5, 0]


def test_a_chats_turns_stay_on_one_worker_and_find_their_history(fleet):
    gateway, workers = fleet
    served0, hits0 = served(workers), hits(workers)
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Tell me about sourdough starters and how to keep one alive."}]
    for turn in range(4):
        r = requests.post(gateway.url + "/v1/chat/completions", json={
            "model": "tandem", "messages": messages, "max_tokens": 6, "temperature": 0}, timeout=60)
        assert r.status_code == 200, r.text
        messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                     {"role": "user", "content": f"And what about step {turn + 2}?"}]
    per_worker = delta(served(workers), served0)
    assert sorted(per_worker) == [0, 4]
    home = per_worker.index(4)
    assert delta(hits(workers), hits0)[home] >= 3 * 16  # turns 2-4 each found at least a block of their history


def test_distinct_prefixes_spread_over_both_workers(fleet):
    gateway, workers = fleet
    served0 = served(workers)
    for i in range(16):
        r = complete(gateway.url, {"model": "tandem", "prompt": f"Topic {i}: " + "tell me something. " * 3,
                                   "max_tokens": 1, "temperature": 0})
        assert r.status_code == 200, r.text
    per_worker = delta(served(workers), served0)
    assert sum(per_worker) == 16 and min(per_worker) >= 1


def test_a_home_worker_loaded_above_the_bound_spills_to_the_next_one(fleet):
    gateway, workers = fleet
    served0, decisions0 = served(workers), decisions(gateway)
    body = {"model": "tandem", "prompt": SYSTEM + "Spill test.", "max_tokens": 150, "temperature": 0,
            "ignore_eos": True, "stream": True}
    responses, threads = [], []

    def hold(started: threading.Event):
        with requests.post(gateway.url + "/v1/completions", json=body, stream=True, timeout=120) as r:
            lines = r.iter_lines()
            next(line for line in lines if line)  # the first token: the gateway has placed it
            started.set()
            responses.append((r.status_code, [line for line in lines if line][-1]))

    # Placed one after another while the earlier ones stream (150 tokens x 0.2 s each, 30 s: the first is still
    # streaming when a loaded host places the 8th): with two workers and the
    # other idle, the home takes a request while it holds h with h + 1 <= ceil(1.25 x (h + 1) / 2) + 2, i.e. up to
    # h = 6; the 8th spills (8 > ceil(5.0) + 2).
    for _ in range(8):
        started = threading.Event()
        thread = threading.Thread(target=hold, args=(started,))
        thread.start()
        threads.append(thread)
        assert started.wait(60)
    for thread in threads:
        thread.join(180)
    assert [status for status, _ in responses] == [200] * 8
    assert all(last == b"data: [DONE]" for _, last in responses)
    assert sorted(delta(served(workers), served0)) == [1, 7]
    assert delta(list(decisions(gateway).values()), list(decisions0.values())) == [7, 1]
