"""Rollouts between engines, end to end: a colocated deployment on Tandem's own engine, a canary of a revision that
runs vLLM instead (its workers started from `make vllm`'s environment), analysed on the gateway's numbers and
promoted under a steady stream of client requests with none failed; then a one-click rollback to the Tandem
revision, again with none failed. The gateway serves each request inside one revision, so no request crosses
engines."""
from __future__ import annotations

import threading
import time

import pytest
import requests

from controlplane.settings_fleet import TANDEM_VLLM_PYTHON
from tests.procs import free_port

pytestmark = [pytest.mark.integration]
if not TANDEM_VLLM_PYTHON:
    pytestmark.append(pytest.mark.skip(reason="no vLLM environment here (`make vllm` builds .venv-vllm)"))

NAME = "it-engines"
TANDEM_SETTINGS = {"threads": 1, "kv_cache_bytes": 16 << 20}
VLLM_SETTINGS = {"engine": "vllm", "threads": 1, "compile": False, "kv_cache_bytes": 1 << 30, "max_num_seqs": 8,
                 "max_model_len": 512}


class Clients(threading.Thread):
    """Streamed completions one after another; each outcome with the revision that served it."""

    def __init__(self, gateway: str):
        super().__init__(daemon=True)
        self.gateway, self.outcomes, self.halt = gateway, [], threading.Event()

    def run(self):
        while not self.halt.is_set():
            try:
                with requests.post(f"{self.gateway}/v1/completions", stream=True, timeout=60, json={
                        "model": NAME, "prompt": "Count: one, two,", "max_tokens": 16, "temperature": 0,
                        "stream": True}) as response:
                    lines = [line for line in response.iter_lines() if line]
                    ok = response.status_code == 200 and lines[-1] == b"data: [DONE]" and not any(
                        b'"error"' in line for line in lines)
                    self.outcomes.append((response.headers.get("X-Tandem-Revision", ""), ok or lines[-3:]))
            except requests.RequestException as exc:
                self.outcomes.append(("", repr(exc)))
            time.sleep(0.1)

    def failed(self) -> list:
        return [outcome for _, outcome in self.outcomes if outcome is not True]

    def served_by(self, revision: int) -> int:
        return sum(1 for served, outcome in self.outcomes if served == str(revision) and outcome is True)


def _settled(live, revision: int, timeout: float = 400) -> None:
    def settled():
        if any(a["status"] in ("pending", "running") for a in live.actions(NAME)
               if a["kind"] in ("revision", "rollback", "promote")):
            return None
        workers = [w for w in live.workers(NAME, role="colocated")
                   if w["status"] in ("pending", "starting", "ready", "draining")]
        return workers if workers and all(w["status"] == "ready" and w["revision"] == revision
                                          for w in workers) else None
    live.wait_for(f"revision {revision}'s workers alone", settled, timeout=timeout, interval=1)


def test_a_canary_from_tandem_to_vllm_is_promoted_and_rolled_back_without_a_failed_request(live, tiny_model_dir):
    gateway_port = free_port()
    created = live.api("POST", "deployments/", json={
        "name": NAME, "mode": "colocated", "model_path": str(tiny_model_dir), "dtype": "float32",
        "engine_settings": TANDEM_SETTINGS, "replicas": {"colocated": 1}, "gateway_port": gateway_port})
    assert created.status_code == 202, created.text
    gateway = f"http://127.0.0.1:{gateway_port}"
    clients = Clients(gateway)
    try:
        _settled(live, 1)
        live.wait_for("the gateway to serve", lambda: requests.get(f"{gateway}/health", timeout=5).ok, timeout=60)
        clients.start()
        started = live.api("POST", f"deployments/{NAME}/rollouts", json={
            "revision": {"engine_settings": VLLM_SETTINGS, "comment": "to vLLM"}, "strategy": "canary",
            "steps": [{"weight": 50, "duration_s": 6}],
            # Two engines on one loaded 2-core host: their latencies differ by design; what is tested is that the
            # analysis reads both and the rollout runs across engines (the ratio's own behaviour is unit-tested).
            "analysis": {"min_requests": 5, "interval_s": 2, "max_latency_ratio": 100}})
        assert started.status_code == 201, started.text
        rollout = started.json()

        def ended():
            body = live.api("GET", f"deployments/{NAME}/rollouts/{rollout['id']}").json()
            return body if body["status"] in ("promoted", "aborted") else None

        promoted = live.wait_for("the canary to end", ended, timeout=600, interval=1)
        assert promoted["status"] == "promoted", promoted
        _settled(live, rollout["revision"])
        worker = live.workers(NAME, role="colocated")[-1]
        assert live.api("GET", f"workers/{worker['id']}/").json()["revision"] == rollout["revision"]
        served = clients.served_by(rollout["revision"])
        live.wait_for("requests on vLLM alone", lambda: clients.served_by(rollout["revision"]) >= served + 3,
                      timeout=60)

        back = live.api("POST", f"deployments/{NAME}/rollback", json={"revision": 1})
        assert back.status_code == 202, back.text
        _settled(live, 1)
        served = clients.served_by(1)
        live.wait_for("requests on Tandem again", lambda: clients.served_by(1) >= served + 3, timeout=60)
    finally:
        clients.halt.set()
        clients.join(90)
        live.api("DELETE", f"deployments/{NAME}/")
    assert clients.failed() == []
    assert clients.served_by(1) >= 6 and clients.served_by(rollout["revision"]) >= 3
