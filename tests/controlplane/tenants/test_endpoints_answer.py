"""The gateway learns tenants through the endpoints answer (docs/contracts.md, "Tenants"): key hashes with their
tenant's class, limits, whether it may use the deployment, and the keys' expiry; never a key. Revoked and expired
keys are left out; an open deployment without tenant keys answers as before (no `tenants`, no `requires_key`)."""
from __future__ import annotations

import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone

pytestmark = pytest.mark.django_db


def _answer(viewer_api, name="demo") -> dict:
    response = viewer_api.get(f"/api/v1/deployments/{name}/endpoints")
    assert response.status_code == 200
    return response.json()


def test_an_open_deployment_without_tenant_keys_answers_as_before(viewer_api, deployment):
    body = _answer(viewer_api)
    assert "tenants" not in body and "requires_key" not in body


def test_the_answer_carries_hashes_classes_limits_and_access_never_a_key(viewer_api, admin, make_deployment):
    from controlplane.tenants.services import deployment_access_set, tenant_create, tenant_key_issue

    demo, other = make_deployment("demo"), make_deployment("other")
    acme = tenant_create(name="acme", priority_class="interactive", deployments=["demo"],
                         limits={"requests_per_minute": 5, "max_tokens": 16}, actor=admin)
    bulk = tenant_create(name="bulk", priority_class="batch", deployments=["other"], actor=admin)
    expires = timezone.now() + timedelta(days=1)
    _, acme_key = tenant_key_issue(tenant=acme, expires_at=expires, actor=admin)
    _, bulk_key = tenant_key_issue(tenant=bulk, actor=admin)
    deployment_access_set(deployment=demo, requires_key=True, actor=admin)

    body = _answer(viewer_api)
    assert body["requires_key"] is True
    assert body["tenants"] == {
        "acme": {"class": "interactive", "limits": {"requests_per_minute": 5, "max_tokens": 16}, "allowed": True,
                 "keys": [{"hash": hashlib.sha256(acme_key.encode()).hexdigest(),
                           "expires_at": pytest.approx(expires.timestamp())}]},
        "bulk": {"class": "batch", "limits": {}, "allowed": False,
                 "keys": [{"hash": hashlib.sha256(bulk_key.encode()).hexdigest(), "expires_at": None}]},
    }
    text = str(body)
    assert acme_key not in text and bulk_key not in text
    assert _answer(viewer_api, "other")["requires_key"] is False  # still open: the keys are known, none is needed


def test_revoked_and_expired_keys_and_deleted_tenants_leave_the_answer(viewer_api, admin, deployment):
    from controlplane.tenants.models import TenantKey
    from controlplane.tenants.services import tenant_create, tenant_delete, tenant_key_issue, tenant_key_revoke

    acme = tenant_create(name="acme", deployments=["demo"], actor=admin)
    revoked, _ = tenant_key_issue(tenant=acme, actor=admin)
    expiring, _ = tenant_key_issue(tenant=acme, actor=admin)
    kept, _ = tenant_key_issue(tenant=acme, actor=admin)
    tenant_key_revoke(key=revoked, actor=admin)
    TenantKey.objects.filter(pk=expiring.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert [k["hash"] for k in _answer(viewer_api)["tenants"]["acme"]["keys"]] == [kept.key_hash]
    tenant_delete(tenant=acme, actor=admin)
    assert "tenants" not in _answer(viewer_api)


def test_the_core_reads_tenants_only_through_the_provider(monkeypatch):
    from controlplane import tenant_provider
    from controlplane.tenants import selectors

    assert tenant_provider._provider.gateway_access is selectors.gateway_access
    monkeypatch.setattr(tenant_provider, "_provider", tenant_provider.NO_TENANTS)
    assert tenant_provider.gateway_access(object()) == {}


def test_the_gateway_reads_the_answer_and_knows_the_key_by_its_hash(viewer_api, admin, deployment):
    """Both halves of the contract: what the control plane sends is what the gateway accepts and enforces."""
    from inference.gateway.membership import parse_endpoints, parse_tenants
    from inference.gateway.openai_protocol import ApiError
    from inference.gateway.tenancy import TenantGate

    from controlplane.tenants.services import deployment_access_set, tenant_create, tenant_key_issue

    acme = tenant_create(name="acme", deployments=["demo"], limits={"tokens_per_minute": 100}, actor=admin)
    _, key = tenant_key_issue(tenant=acme, expires_at=timezone.now() + timedelta(hours=1), actor=admin)
    deployment_access_set(deployment=deployment, requires_key=True, actor=admin)
    body = _answer(viewer_api)
    parse_endpoints(body)
    tenancy = parse_tenants(body)
    gate = TenantGate(lambda: tenancy)
    assert gate.identify(f"Bearer {key}", "demo").policy.limits == {"tokens_per_minute": 100}
    with pytest.raises(ApiError) as raised:
        gate.identify("Bearer tk-not-a-key", "demo")
    assert raised.value.status == 401
