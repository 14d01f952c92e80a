"""A simulated worker hands its prefill turn by the body's `priority`, as a real worker's scheduler admits: an
interactive request queued behind batch ones is prefilled next; an unknown priority is a 400."""
from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from inference.engine.scheduler import PRIORITY_AGING_S
from inference.worker.sim_profile import BUILTIN
from tests.inference.worker.sim.test_same_server import start_worker

pytestmark = pytest.mark.integration

PREFILL_S = 0.25  # each prompt's prefill in this profile: the turn a queued request waits for


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sim-priority")
    data = json.loads(json.dumps(BUILTIN["tiny-cpu"]))
    data["name"] = "slow-prefill"
    data["roles"]["colocated"]["prefill"] = {"a": PREFILL_S, "b": 0.0}
    (tmp / "profile.json").write_text(json.dumps(data))
    proc = start_worker(tmp, "sim-priority", "colocated", "--simulate", str(tmp / "profile.json"))  # the later wins
    yield proc
    proc.stop()


def _prefill_order(url: str) -> tuple[list[str], float, bool]:
    """One try: a holder's prefill takes the turn, then batch, batch, standard, interactive requests queue behind it.
    Returns the order of the first tokens, the longest any queued request can have waited (from before the first
    one was posted to the last first token), and whether every request was queued before the holder's prefill ended
    (on a loaded machine the posts may outlast it: b1 then takes the free turn before i1 has arrived)."""
    first_token_at, threads = {}, []
    queued_at = all_queued_at = None
    for name, priority in (("holder", "batch"), ("b1", "batch"), ("b2", "batch"), ("s1", "standard"),
                           ("i1", "interactive")):
        if name == "b1":
            queued_at = time.monotonic()  # aging counts each request's wait from its arrival; b1 arrives first
        # The worker answers its headers once it admitted the request, so each one queues behind the one before.
        response = requests.post(url + "/v1/generate", json={"prompt": f"go {name}", "max_tokens": 1,
                                                             "priority": priority}, stream=True, timeout=30)
        assert response.status_code == 200, response.text

        def read(response=response, name=name):
            with response:
                for line in response.iter_lines():
                    if json.loads(line)["type"] == "token":
                        first_token_at.setdefault(name, time.monotonic())

        threads.append(threading.Thread(target=read, daemon=True))
        threads[-1].start()
    all_queued_at = time.monotonic()
    for thread in threads:
        thread.join(timeout=30)
    return (sorted(first_token_at, key=first_token_at.get), max(first_token_at.values()) - queued_at,
            all_queued_at <= first_token_at["holder"])


def test_an_interactive_request_queued_behind_batch_ones_is_prefilled_first(worker):
    # A request that waits PRIORITY_AGING_S moves up a band (then arrival order decides, rightly): the order by band
    # shows only where the queued requests waited less than that, and where all of them were queued while the
    # holder's prefill held the turn; a loaded machine may give neither on one try.
    tries = []
    for _ in range(5):
        order, waited, all_queued = _prefill_order(worker.url)
        tries.append((order, round(waited, 2), all_queued))
        if waited < PRIORITY_AGING_S and all_queued:
            assert order == ["holder", "i1", "s1", "b1", "b2"], tries
            return
    pytest.fail(f"on every try the queued requests waited PRIORITY_AGING_S ({PRIORITY_AGING_S} s) or more, or were "
                f"not all queued before the holder's prefill ended, so the order did not show the bands: {tries}")


def test_an_unknown_priority_is_a_400_naming_the_field(worker):
    response = requests.post(worker.url + "/v1/generate", json={"prompt": "hi", "priority": "urgent"}, timeout=30)
    assert response.status_code == 400 and response.json()["error"]["param"] == "priority"
