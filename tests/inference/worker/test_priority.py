"""A real colocated worker admits its waiting requests by the body's `priority` (the gateway sends the tenant's class):
an interactive request queued behind batch ones gets the next free slot; an unknown priority is a 400."""
from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from inference.engine.scheduler import PRIORITY_AGING_S
from tests.inference.worker.support import HTTP_TIMEOUT_S, assert_openai_error, start_worker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def worker(tiny_model_dir, tmp_path_factory):
    # One running sequence at a time: every other request waits in the scheduler's queue.
    proc = start_worker("priority", "colocated", tiny_model_dir, tmp_path_factory.mktemp("priority"),
                        "--max-num-seqs", "1")
    yield proc
    proc.stop()


def _stream(url: str, body: dict, first_token_at: dict, done_at: dict, name: str) -> threading.Thread:
    """Post `body` and return once the worker admitted it (it answers its headers then); a thread reads the
    stream, noting when its first token and its end arrive."""
    response = requests.post(url + "/v1/generate", json=body, stream=True, timeout=HTTP_TIMEOUT_S)
    assert response.status_code == 200, response.text

    def read():
        with response:
            for line in response.iter_lines():
                event = json.loads(line)
                if event["type"] == "token":
                    first_token_at.setdefault(name, time.monotonic())
                elif event["type"] == "done":
                    done_at[name] = time.monotonic()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_an_interactive_request_queued_behind_batch_ones_is_admitted_first(worker):
    first_token_at, done_at = {}, {}
    holder = _stream(worker.url, {"prompt": "hold the only slot", "max_tokens": 200, "ignore_eos": True},
                     first_token_at, done_at, "holder")
    threads = [holder]
    for name, priority in (("b1", "batch"), ("b2", "batch"), ("s1", "standard"), ("i1", "interactive")):
        threads.append(_stream(worker.url, {"prompt": f"queued {name}", "max_tokens": 2, "ignore_eos": True,
                                            "priority": priority}, first_token_at, done_at, name))
    queued_at = time.monotonic()
    for thread in threads:
        thread.join(timeout=HTTP_TIMEOUT_S)
    # The others waited for the holder's end, and for less than it takes a waiting request to move up a band (then
    # the queue order would decide).
    assert 0 < done_at["holder"] - queued_at < PRIORITY_AGING_S, "the holder's stream lasted too short or too long"
    assert sorted(first_token_at, key=first_token_at.get) == ["holder", "i1", "s1", "b1", "b2"]


@pytest.mark.parametrize("priority", ["urgent", "", 1, ["interactive"]])
def test_an_unknown_priority_is_a_400_naming_the_field(worker, priority):
    response = requests.post(worker.url + "/v1/generate", json={"prompt": "hi", "max_tokens": 1, "priority": priority},
                             timeout=HTTP_TIMEOUT_S)
    assert assert_openai_error(response, 400, "priority must be one of interactive, standard, batch")["param"] \
        == "priority"
