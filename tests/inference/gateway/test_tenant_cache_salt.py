"""The gateway sends each tenant's requests with its cache_salt, so the workers key that tenant's prefix-cache blocks
with it: through a real gateway in front of a real tiny-model worker, the same prompt sent with two tenants' keys
finds nothing of the other's cached (its time to first token says nothing about what the other sent), while the
same tenant hits its own blocks. An anonymous caller of an open deployment sends no salt."""
from __future__ import annotations

import hashlib

import pytest
import requests

from inference.gateway.tenancy import TenantGate
from inference.gateway.tenant_policy import parse_tenancy
from tests.inference.gateway.support import PLAIN_FLEET, TOKEN, ControlPlane, shared_workers, start_gateway

pytestmark = pytest.mark.integration

KEYS = {"acme": "tk-acme-salt-0123456", "bolt": "tk-bolt-salt-0123456"}
PROMPT = "Our merger with the northern supplier closes on the ninth of March, pending the board vote. " * 2


def _tenancy(requires_key: bool) -> dict:
    return {"requires_key": requires_key, "tenants": {
        name: {"class": "standard", "limits": {}, "allowed": True,
               "keys": [{"hash": hashlib.sha256(key.encode()).hexdigest(), "expires_at": None}]}
        for name, key in KEYS.items()}}


def test_a_tenants_worker_body_carries_its_salt_and_an_anonymous_one_none():
    policy = parse_tenancy(_tenancy(requires_key=False))
    gate = TenantGate(lambda: policy)
    worker_body = {"max_tokens": 4}
    gate.admit(gate.identify(f"Bearer {KEYS['acme']}", "demo"), {}, worker_body).release()
    assert worker_body["cache_salt"] == "acme"
    anonymous = {"max_tokens": 4}
    gate.admit(gate.identify(None, "demo"), {}, anonymous).release()
    assert "cache_salt" not in anonymous


@pytest.fixture(scope="module")
def fleet(request, tiny_model_dir, tmp_path_factory):
    worker = shared_workers(request, tmp_path_factory, "plain", PLAIN_FLEET, tiny_model_dir)["colocated"]
    control_plane = ControlPlane()
    control_plane.start()
    control_plane.endpoints.update({"groups": [{"revision": 1, "prefill": [], "decode": [],
                                                "colocated": [worker.url]}], **_tenancy(requires_key=True)})
    gateway = start_gateway("gateway", ["--control-plane", control_plane.url, "--deployment", "demo",
                                        "--token", TOKEN, "--membership-interval", "0.2",
                                        "--no-prefix-affinity"], tmp_path_factory.mktemp("gateway-cache-salt"))
    yield gateway, worker
    gateway.stop()
    control_plane.stop()


def _hit_tokens(gateway, worker, tenant: str) -> int:
    """The prompt tokens the worker found cached for one request of `tenant`."""
    def hits() -> int:
        return requests.get(worker.url + "/info", timeout=30).json()["prefix_cache"]["hit_tokens"]

    before = hits()
    r = requests.post(gateway.url + "/v1/completions", headers={"Authorization": f"Bearer {KEYS[tenant]}"},
                      json={"model": "demo", "prompt": PROMPT, "max_tokens": 2}, timeout=60)
    assert r.status_code == 200, r.text
    return hits() - before


def test_two_tenants_do_not_share_blocks_and_one_tenant_does(fleet):
    gateway, worker = fleet
    assert _hit_tokens(gateway, worker, "acme") == 0
    assert _hit_tokens(gateway, worker, "bolt") == 0
    assert _hit_tokens(gateway, worker, "acme") > 0
    assert _hit_tokens(gateway, worker, "bolt") > 0
