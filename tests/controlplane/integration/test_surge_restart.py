"""An operator's restart or drain of the only decode worker costs clients nothing: the replacement starts first,
the old worker drains once it is ready, and a client sending requests all along sees no failed request."""
from __future__ import annotations

import threading

import pytest
import requests

from tests.controlplane.integration.conftest import DEPLOYMENT, completion, wait_steady

pytestmark = pytest.mark.integration


class Traffic(threading.Thread):
    """Completions back to back until stopped; counts what succeeded and keeps what failed."""

    def __init__(self, gateway_url: str):
        super().__init__(daemon=True)
        self.gateway_url = gateway_url
        self.stopping = threading.Event()
        self.num_ok = 0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                response = completion(self.gateway_url, prompt="Count with me", max_tokens=8, timeout=60)
            except requests.RequestException as exc:
                self.failures.append(repr(exc))
                continue
            if response.status_code == 200:
                self.num_ok += 1
            else:
                self.failures.append(f"HTTP {response.status_code}: {response.text[:200]}")


@pytest.mark.parametrize("verb", ["restart", "drain"])
def test_an_operator_restart_or_drain_of_the_only_decode_worker_fails_no_request(live, deployment, verb):
    old, = [w for w in wait_steady(live) if w["role"] == "decode"]
    traffic = Traffic(deployment)
    traffic.start()
    try:
        live.wait_for("traffic to flow", lambda: traffic.num_ok >= 3, timeout=60)
        response = live.api("POST", f"workers/{old['id']}/{verb}", json={"reason": "surge test"})
        assert response.status_code == 202, response.text
        action_id = response.json()["action"]["id"]
        action = live.wait_for(f"the {verb} to finish",
                               lambda: (a := live.action(action_id))["status"] in ("succeeded", "failed") and a,
                               timeout=180)
        assert action["status"] == "succeeded", action
        num_before = traffic.num_ok
        live.wait_for("traffic to flow after it", lambda: traffic.num_ok >= num_before + 3, timeout=60)
    finally:
        traffic.stopping.set()
        traffic.join(timeout=90)
    assert traffic.failures == [], traffic.failures
    new, = [w for w in wait_steady(live) if w["role"] == "decode"]
    assert new["id"] == action["result"]["replacement"] != old["id"]
    assert live.api("GET", f"workers/{old['id']}/").json()["status"] == "stopped"
