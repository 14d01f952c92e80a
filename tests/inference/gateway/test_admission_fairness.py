"""A real gateway (two request slots: --max-outstanding-per-worker 2) in front of a real simulated worker, polling a
stand-in control plane with two tenants of one class: tenant A queues a backlog of long streams, then tenant B's
short request goes ahead of A's waiting ones (B's virtual token counter is lifted to A's on arrival, and A's grows
with every token its running streams are served). The wait shows on /metrics."""
from __future__ import annotations

import hashlib
import threading
import time

import pytest
import requests

from tests.inference.gateway.support import TOKEN, ControlPlane, start_gateway, stop_all
from tests.inference.worker.sim.test_gateway_in_front import start_simulated

pytestmark = pytest.mark.integration

KEYS = {"a": "tk-tenant-a-0123456", "b": "tk-tenant-b-0123456"}
NUM_A = 8
LONG_TOKENS = 300


def _tenant(name: str) -> dict:
    return {"class": "standard", "limits": {}, "allowed": True,
            "keys": [{"hash": hashlib.sha256(KEYS[name].encode()).hexdigest(), "expires_at": None}]}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("admission")
    worker = start_simulated([("colocated", "colocated")], log_dir)["colocated"]
    control_plane = ControlPlane()
    control_plane.start()
    control_plane.endpoints.update({"groups": [{"revision": 3, "prefill": [], "decode": [],
                                                "colocated": [worker.url]}],
                                    "requires_key": True,
                                    "tenants": {"a": _tenant("a"), "b": _tenant("b")}})
    try:
        gateway = start_gateway("gateway", ["--control-plane", control_plane.url, "--deployment", "demo", "--token",
                                            TOKEN, "--max-outstanding-per-worker", "2"], log_dir)
    except BaseException:
        stop_all([worker])
        control_plane.stop()
        raise
    yield gateway
    stop_all([gateway, worker])
    control_plane.stop()


def _complete(gateway, tenant: str, max_tokens: int) -> requests.Response:
    return requests.post(gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {KEYS[tenant]}"},
                         json={"model": "demo", "prompt": "one two three", "max_tokens": max_tokens}, timeout=120)


def _queued(gateway, tenant: str) -> float:
    for line in requests.get(gateway.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("tandem_gateway_queue_length{") and f'tenant="{tenant}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_short_request_of_tenant_b_is_served_ahead_of_tenant_a_backlog(gateway):
    finished: dict[str, float] = {}
    statuses = []

    def send(name: str, tenant: str, max_tokens: int) -> None:
        resp = _complete(gateway, tenant, max_tokens)
        statuses.append(resp.status_code)
        finished[name] = time.monotonic()

    threads = [threading.Thread(target=send, args=(f"a{i}", "a", LONG_TOKENS)) for i in range(NUM_A)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 30
    while _queued(gateway, "a") < NUM_A - 2:  # two run, the rest wait
        assert time.monotonic() < deadline, "tenant A's backlog never formed"
        time.sleep(0.05)
    short = threading.Thread(target=send, args=("b", "b", 4))
    short.start()
    threads.append(short)
    for thread in threads:
        thread.join(120)
    assert statuses == [200] * (NUM_A + 1)
    a_done = sorted(t for name, t in finished.items() if name != "b")
    # FIFO would serve B after all eight of A's; fair queuing serves it in the first free slot.
    assert finished["b"] < a_done[3], f"B finished after {sum(t < finished['b'] for t in a_done)} of A's requests"
    metrics = requests.get(gateway.url + "/metrics", timeout=10).text
    assert 'tandem_gateway_queue_wait_seconds_count{class="standard",model="demo",role="gateway",tenant="a"} 8.0' \
        in metrics

