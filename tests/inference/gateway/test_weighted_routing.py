"""Two real colocated workers (tiny model) behind a real gateway with --worker-weight 3 and 1, under steady load:
8 clients each sending its next request as soon as its last one is answered, 320 requests of 32 tokens.

What the rule fixes is the requests each worker holds: at every pick the weight-3 worker is brought to 6 of the 8
in flight and the weight-1 worker to 2. How many requests each one finishes is that times how fast it finishes
them, and on a shared CPU the busier worker runs slower (a batch of 6 steps slower than a batch of 2: CI saw a
65% share on a loaded machine), so the count share is only held to "the heavy worker served more"; the
time-integrated hold, which the rule decides, is held to a ratio within 20% of 3 (2.4 to 3.6: a 2:1 or an even
split fails). Not tighter: the workers' clocks miss each request's turnaround in the client and the gateway, a
larger share of the light worker's shorter requests, which lifts the ratio above 3 as the host gets busier (CI saw
3.17). Both are read from the workers' own /metrics (requests finished, the sum of their request latencies), never
from the gateway whose choice is under test."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.inference.gateway.support import start_gateway, start_workers, stop_all

pytestmark = pytest.mark.integration

NUM_CLIENTS = 8
NUM_REQUESTS = 320
# ignore_eos: every request takes the same 32 steps, so no worker is luckier with short answers.
BODY = {"model": "tandem", "prompt": "The quick brown fox", "max_tokens": 32, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("gateway-weights")
    heavy, light = start_workers([("heavy", "colocated"), ("light", "colocated")], tiny_model_dir, log_dir)
    procs = [heavy, light]
    try:
        procs.append(start_gateway("gateway", ["--colocated", f"{heavy.url},{light.url}",
                                               "--worker-weight", f"{heavy.url}=3",
                                               "--worker-weight", f"{light.url}=1",
                                               # Every request has the same prompt: under prefix affinity its home
                                               # would take them all up to the bound. This tests the load rule.
                                               "--no-prefix-affinity"], log_dir))
        yield procs[2], heavy, light
    finally:
        stop_all(procs)


def _metric(worker_url: str, prefix: str) -> float:
    text = requests.get(worker_url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def _served_and_held(worker_url: str) -> tuple[float, float]:
    """Requests the worker finished, and the seconds it held requests summed over requests (the integral over time
    of how many it held)."""
    return (_metric(worker_url, "tandem_request_success_total{"),
            _metric(worker_url, "tandem_e2e_request_latency_seconds_sum{"))


def test_the_gateway_shows_each_workers_weight(fleet):
    gateway, heavy, light = fleet
    health = requests.get(gateway.url + "/health", timeout=10).json()
    assert {w["url"]: w["weight"] for w in health["groups"][0]["colocated"]} == {heavy.url: 3, light.url: 1}
    models = requests.get(gateway.url + "/v1/models", timeout=10).json()["data"][0]["workers"]
    assert {w["url"]: w["weight"] for w in models} == {heavy.url: 3, light.url: 1}
    metrics = requests.get(gateway.url + "/metrics", timeout=10).text
    assert (f'tandem_gateway_worker_weight{{model="tandem",role="gateway",stage="colocated",worker="{heavy.url}"}} '
            "3.0") in metrics


def test_under_steady_load_the_workers_take_requests_in_the_ratio_of_their_weights(fleet):
    gateway, heavy, light = fleet
    before = {url: _served_and_held(url) for url in (heavy.url, light.url)}

    def client(num: int) -> list[int]:
        with requests.Session() as session:
            return [session.post(gateway.url + "/v1/completions", json=BODY, timeout=120).status_code
                    for _ in range(num)]

    with ThreadPoolExecutor(NUM_CLIENTS) as pool:
        statuses = [code for codes in pool.map(client, [NUM_REQUESTS // NUM_CLIENTS] * NUM_CLIENTS)
                    for code in codes]
    assert statuses == [200] * NUM_REQUESTS
    (served_heavy, held_heavy), (served_light, held_light) = (
        tuple(now - then for now, then in zip(_served_and_held(url), before[url])) for url in (heavy.url, light.url))
    assert served_heavy + served_light == NUM_REQUESTS
    figures = (f"heavy served {served_heavy:.0f}, held {held_heavy:.1f} s; "
               f"light served {served_light:.0f}, held {held_light:.1f} s")
    assert served_heavy > served_light, figures
    assert held_heavy / held_light == pytest.approx(3, rel=0.2), figures
