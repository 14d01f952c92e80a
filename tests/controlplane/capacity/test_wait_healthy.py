"""A profiling worker that answers 503 "starting" (loading its model, compiling its decode step) gets the warm-up's
deadline, as the health pass gives a serving worker; one that answers nothing, or answers otherwise, keeps its
start deadline. A real HTTP server on a local port stands for the worker."""
from __future__ import annotations

import time

import pytest

from controlplane.capacity.load_driver import ProfileError, wait_healthy
from tests.http_stub import JsonStub


@pytest.fixture
def worker():
    """start(answer) -> the URL of a stand-in worker whose /health answers answer() -> (status, body)."""
    stubs = []

    def start(answer):
        stubs.append(JsonStub(lambda path: answer() if path == "/health" else (200, {"role": "colocated"})))
        return stubs[-1].url

    yield start
    for stub in stubs:
        stub.close()


def test_a_worker_still_starting_past_the_start_deadline_is_waited_for(worker):
    ready_at = time.monotonic() + 1.5  # past the 0.3 s start deadline below
    url = worker(lambda: (200, {"status": "ok"}) if time.monotonic() >= ready_at else
                 (503, {"status": "starting", "reason": "loading the model, then compiling its decode step"}))
    assert wait_healthy(url, timeout=0.3, alive=lambda: True, warmup_timeout=60) == {"role": "colocated"}
    assert time.monotonic() >= ready_at


@pytest.mark.parametrize("answer", [(503, {"status": "dead", "reason": "the engine failed to load"}),
                                    (500, {"status": "starting"}), (503, ["starting"])])
def test_any_other_answer_keeps_the_start_deadline(worker, answer):
    url = worker(lambda: answer)
    began = time.monotonic()
    with pytest.raises(ProfileError, match="was not ready within 1 s"):
        wait_healthy(url, timeout=1.0, alive=lambda: True, warmup_timeout=60)
    assert time.monotonic() - began < 30


def test_the_warm_up_deadline_ends_the_wait_too(worker):
    url = worker(lambda: (503, {"status": "starting"}))
    with pytest.raises(ProfileError, match="was not ready within 2 s"):
        wait_healthy(url, timeout=0.3, alive=lambda: True, warmup_timeout=2.0)


def test_a_worker_that_exits_while_starting_fails_at_once(worker):
    url = worker(lambda: (503, {"status": "starting"}))
    with pytest.raises(ProfileError, match="exited before it was ready"):
        wait_healthy(url, timeout=0.3, alive=lambda: False, warmup_timeout=60)
