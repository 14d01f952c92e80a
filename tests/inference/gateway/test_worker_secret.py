"""A gateway given its deployment's worker key (inference.worker_secret) sends each worker the secret of the
worker's own revision: during a rollout, with two revisions' workers each holding its own secret, requests succeed
in both groups (the prefill worker sends the secret on to decode). A gateway without the key gets the workers'
refusal and answers 502 naming the secret, never a 401 that would tell the client its own key is wrong.

Simulated prefill/decode workers (the real worker server in front of a simulated engine), so that four workers start
in a blink; a stand-in control plane names them in its membership."""
from __future__ import annotations

import time

import pytest
import requests

from inference.worker_secret import KEY_ENV, SECRET_ENV, SECRET_HEADER, revision_secret
from tests.inference.gateway.support import TOKEN, ControlPlane, stop_all
from tests.procs import free_port, start, wait_http

pytestmark = pytest.mark.integration

KEY = "deployment-key-for-tests"
BODY = {"model": "demo", "prompt": "a b c d", "max_tokens": 3, "ignore_eos": True}


def _sim_worker(name: str, role: str, revision: int, log_dir):
    port = free_port()
    proc = start(name, ["-m", "inference.worker", "--simulate", "tiny-cpu", "--role", role, "--model", "/m/sim",
                        "--port", str(port), "--revision", str(revision)], log_dir,
                 env={SECRET_ENV: revision_secret(KEY, revision)})
    proc.url = f"http://127.0.0.1:{port}"
    return proc


def _gateway(name: str, control_plane: ControlPlane, log_dir, env: dict):
    port = free_port()
    proc = start(name, ["-m", "inference.gateway", "--port", str(port), "--control-plane", control_plane.url,
                        "--deployment", "demo", "--token", TOKEN, "--membership-interval", "0.2"], log_dir, env=env)
    proc.url = f"http://127.0.0.1:{port}"
    wait_http(proc, proc.url + "/v1/models", timeout=60)
    return proc


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("gateway-worker-secret")
    workers = {f"{role}-{revision}": _sim_worker(f"{role}-{revision}", role, revision, log_dir)
               for revision in (1, 2) for role in ("prefill", "decode")}
    control_plane = ControlPlane()
    control_plane.endpoints["mode"] = "disaggregated"
    control_plane.endpoints["groups"] = [
        {"revision": revision, "colocated": [], "prefill": [workers[f"prefill-{revision}"].url],
         "decode": [workers[f"decode-{revision}"].url], "traffic_weight": 50, "variant": f"r{revision}"}
        for revision in (2, 1)]
    control_plane.start()
    procs = list(workers.values())
    try:
        for proc in procs:
            wait_http(proc, proc.url + "/health", timeout=60)
        keyed = _gateway("gateway-keyed", control_plane, log_dir, {KEY_ENV: KEY})
        procs.append(keyed)
        keyless = _gateway("gateway-keyless", control_plane, log_dir, {KEY_ENV: ""})
        procs.append(keyless)
        for gateway in (keyed, keyless):
            _wait_ready(gateway)
        yield keyed, keyless, workers
    finally:
        stop_all(procs)
        control_plane.stop()


def _wait_ready(gateway) -> None:
    deadline = time.monotonic() + 60
    while True:
        health = requests.get(gateway.url + "/health", timeout=10).json()
        states = [w["state"] for g in health.get("groups", []) for role in ("prefill", "decode") for w in g[role]]
        if len(states) == 4 and all(state == "ready" for state in states):
            return
        assert time.monotonic() < deadline, health
        time.sleep(0.05)


def test_during_a_rollout_each_revision_gets_its_own_secret(fleet):
    keyed, _, _ = fleet
    served = set()
    for user in range(40):
        r = requests.post(keyed.url + "/v1/completions", json={**BODY, "user": f"user-{user}"}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3  # decode took the KV push and streamed the rest
        served.add(r.headers["X-Tandem-Revision"])
    assert served == {"1", "2"}


def test_one_revisions_secret_does_not_open_another_revisions_workers(fleet):
    _, _, workers = fleet
    r = requests.post(workers["prefill-1"].url + "/v1/prefill", timeout=30,
                      headers={SECRET_HEADER: revision_secret(KEY, 2)},
                      json={"prompt": "a b", "max_tokens": 2, "decode_url": workers["decode-1"].url})
    assert r.status_code == 403, r.text


def test_a_gateway_without_the_key_answers_502_naming_the_secret(fleet):
    _, keyless, _ = fleet
    r = requests.post(keyless.url + "/v1/completions", json=BODY, timeout=60)
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["code"] == "worker_auth" and SECRET_HEADER.lower() in error["message"].lower()
