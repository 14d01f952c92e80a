"""The host holds a simulated worker as SIGSTOP holds a process (the chaos fault `pause` on a simulated fleet): every
request to it waits unanswered, and is answered once released (by the control API, or at the pause's bound)."""
from __future__ import annotations

import json
import threading
import time

import pytest
import requests

from tests.inference.worker.test_sim_host import host_process, worker_argv
from tests.procs import free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    yield from host_process(tmp_path_factory, 4)


def started(host, wid: str) -> str:
    port = free_port()
    answer = requests.post(host.url + "/workers", json={"id": wid, "argv": worker_argv("decode", port)}, timeout=10)
    assert answer.status_code == 200, answer.text
    url = f"http://127.0.0.1:{port}"
    assert requests.get(url + "/health", timeout=5).json()["status"] == "ok"
    return url


def paused(host, wid: str) -> bool:
    return next(w["paused"] for w in requests.get(host.url + "/workers", timeout=5).json()["workers"]
                if w["id"] == wid)


def test_a_paused_worker_answers_nothing_until_resumed_and_then_answers_what_waited(host):
    url = started(host, "held")
    assert requests.post(host.url + "/workers/held/pause", json={"seconds": 60}, timeout=5).json()["paused"] is True
    assert paused(host, "held")
    with pytest.raises(requests.Timeout):
        requests.get(url + "/health", timeout=1.0)
    waited = {}
    thread = threading.Thread(target=lambda: waited.update(r=requests.get(url + "/health", timeout=30)))
    thread.start()
    time.sleep(0.5)
    assert thread.is_alive()  # held, not refused
    resumed = requests.delete(host.url + "/workers/held/pause", timeout=5).json()
    assert resumed == {"id": "held", "paused": False, "resumed": True}
    thread.join(timeout=10)
    assert waited["r"].status_code == 200 and not paused(host, "held")


def test_a_pause_ends_by_itself_at_its_bound(host):
    url = started(host, "bounded")
    requests.post(host.url + "/workers/bounded/pause", json={"seconds": 1.5}, timeout=5)
    began = time.monotonic()
    assert requests.get(url + "/health", timeout=30).status_code == 200
    assert time.monotonic() - began >= 1.0 and not paused(host, "bounded")


def test_a_paused_worker_can_still_be_killed(host):
    url = started(host, "killed")
    requests.post(host.url + "/workers/killed/pause", json={"seconds": 60}, timeout=5)
    assert requests.delete(host.url + "/workers/killed?kill=1", timeout=5).status_code == 202
    deadline = time.monotonic() + 20
    while any(w["id"] == "killed" for w in requests.get(host.url + "/workers", timeout=5).json()["workers"]):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    with pytest.raises(requests.ConnectionError):
        requests.get(url + "/health", timeout=5)


@pytest.fixture(scope="module")
def target(host):
    started(host, "target")


@pytest.mark.parametrize("body", [None, [], {"seconds": "x"}, {"seconds": 0}, {"seconds": -1}, {}])
def test_a_bad_pause_is_a_400_and_an_unknown_worker_a_404(host, target, body):
    r = requests.post(host.url + "/workers/target/pause", json=body, timeout=5)
    assert r.status_code == 400 and "seconds" in r.json()["error"]["message"], r.text
    assert not paused(host, "target")
    assert requests.post(host.url + "/workers/nobody/pause", json={"seconds": 1}, timeout=5).status_code == 404
    assert requests.delete(host.url + "/workers/nobody/pause", timeout=5).status_code == 404


def test_a_stream_under_way_stalls_while_paused_and_then_completes(host):
    port = free_port()
    answer = requests.post(host.url + "/workers", json={"id": "streaming", "argv": worker_argv("colocated", port)},
                           timeout=10)
    assert answer.status_code == 200, answer.text
    response = requests.post(f"http://127.0.0.1:{port}/v1/generate", json={"prompt": "a b c", "max_tokens": 60},
                             stream=True, timeout=30)
    arrivals, events = [], []
    for line in response.iter_lines():
        events.append(json.loads(line))
        arrivals.append(time.monotonic())
        if len(events) == 3:
            requests.post(host.url + "/workers/streaming/pause", json={"seconds": 1.5}, timeout=5)
            paused_at = time.monotonic()
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:])]
    assert events[-1]["type"] == "done" and events[-1]["completion_tokens"] == 60
    assert max(gaps) >= 1.0 and max(arrivals) - paused_at >= 1.0  # no token while held; none lost after
