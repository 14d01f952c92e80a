"""One live stack and one disaggregated tiny-model deployment for the whole integration session (2 cores: model
loads and process starts are the cost). Tests leave the deployment as they found it: 1 prefill, 1 decode, ready."""
from __future__ import annotations

import secrets
import subprocess
import sys

import pytest
import requests

from tests.controlplane.integration.live import IsolatedServices, live_stack_start, live_stack_stop
from tests.procs import ROOT, free_port

DEPLOYMENT = "it-demo"


@pytest.fixture(scope="session")
def live(tmp_path_factory):
    var_dir = tmp_path_factory.mktemp("tandem-it")
    services = IsolatedServices(var_dir)
    stack = None
    try:
        stack = live_stack_start(var_dir, services)
        yield stack
    finally:
        if stack is not None:
            live_stack_stop(stack)
        services.close()


def completion(gateway_url: str, prompt: str = "Hello", max_tokens: int = 4, timeout: float = 30):
    return requests.post(f"{gateway_url}/v1/completions", timeout=timeout,
                         json={"model": DEPLOYMENT, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})


def ready_workers(live, role: str | None = None) -> list[dict]:
    filters = {"role": role} if role else {}
    return [w for w in live.workers(DEPLOYMENT, **filters) if w["status"] == "ready"]


def wait_steady(live, *, prefill: int = 1, decode: int = 1, revision: int | None = None, timeout: float = 120):
    """Until exactly these many ready workers serve (of `revision` when given) and nothing else is in flight: no
    worker starting or draining, and no revision change (new revision, rollback, promote) unfinished: a promote is
    marked done a moment after its last old worker stops, and a new rollout before that is refused with 409."""
    def steady():
        if any(a["status"] in ("pending", "running") and a["kind"] in ("revision", "rollback", "promote")
               for a in live.actions(DEPLOYMENT)):
            return None
        workers = [w for w in live.workers(DEPLOYMENT) if w["role"] != "gateway"]
        serving = [w for w in workers if w["status"] in ("pending", "starting", "ready", "draining")]
        ready = [w for w in serving if w["status"] == "ready" and (revision is None or w["revision"] == revision)]
        counts = {role: sum(w["role"] == role for w in ready) for role in ("prefill", "decode")}
        if counts == {"prefill": prefill, "decode": decode} and len(serving) == prefill + decode:
            return ready
        return None

    return live.wait_for(f"{prefill} prefill + {decode} decode ready", steady, timeout=timeout)


@pytest.fixture(scope="session")
def deployment(live, tiny_model_dir):
    """`it-demo`: created through the API; yields its gateway URL once the gateway answers a completion."""
    gateway_port = free_port()
    response = live.api("POST", "deployments/", json={
        "name": DEPLOYMENT, "mode": "disaggregated", "model_path": str(tiny_model_dir), "dtype": "float32",
        "engine_settings": {"threads": 1, "kv_cache_bytes": 16 << 20},
        "replicas": {"prefill": 1, "decode": 1}, "gateway_port": gateway_port,
    })
    assert response.status_code == 202, response.text
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    live.wait_for("the gateway to answer a completion",
                  lambda: completion(gateway_url, timeout=10).status_code == 200, timeout=150, interval=0.5)
    return gateway_url


@pytest.fixture
def second_node(live):
    """A second agent on this machine, labelled class=bandwidth; the stack's own agent is labelled class=compute."""
    name = f"it-b-{secrets.token_hex(2)}"
    log = open(live.var_dir / "logs" / f"agent-{name}.log", "ab")
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "tandem_agent", "--name", name,
                             "--label", "class=bandwidth"], env=live.env, cwd=ROOT, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        live.wait_for(f"node {name} to register", lambda: live.api("GET", f"nodes/{name}/").status_code == 200,
                      timeout=60)
        assert live.api("PATCH", f"nodes/{live.node_name}/", json={"labels": {"class": "compute"}}).ok
        yield name
    finally:
        subprocess.run([sys.executable, "-c", (
            "import django; django.setup(); "
            "from controlplane.run.shutdown import node_processes_stop as stop; "
            f"stop(node_name={name!r}, reason='test agent stopped')")],
            env={**live.env, "DJANGO_SETTINGS_MODULE": "controlplane.settings"}, cwd=ROOT, timeout=60, check=False)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        live.api("PATCH", f"nodes/{live.node_name}/", json={"labels": {}})
