"""The tenants API: create, read, change and delete tenants, issue and revoke keys (shown once, stored hashed), and
mark a deployment as requiring a key; every bad value is a 400 naming its field, every change one audit row."""
from __future__ import annotations

import hashlib

import pytest

pytestmark = pytest.mark.django_db


def _create(api, **fields):
    body = {"name": "acme", "priority_class": "interactive", "deployments": ["demo"],
            "limits": {"requests_per_minute": 60, "tokens_per_minute": 10000}, **fields}
    return api.post("/api/v1/tenants/", body, format="json")


def test_an_admin_creates_a_tenant_and_viewers_read_it(admin_api, viewer_api, deployment):
    response = _create(admin_api, reason="first customer")
    assert response.status_code == 201, response.content
    assert response.json()["name"] == "acme"
    body = viewer_api.get("/api/v1/tenants/acme/").json()
    assert body["priority_class"] == "interactive"
    assert body["limits"] == {"requests_per_minute": 60, "tokens_per_minute": 10000}
    assert body["deployments"] == ["demo"] and body["num_active_keys"] == 0
    assert [t["name"] for t in viewer_api.get("/api/v1/tenants/").json()] == ["acme"]


def test_each_change_is_an_audit_row(admin_api, deployment):
    from controlplane.models import Action

    _create(admin_api, reason="first customer")
    key_id = admin_api.post("/api/v1/tenants/acme/keys/", {}, format="json").json()["id"]
    admin_api.patch("/api/v1/tenants/acme/", {"limits": {"max_tokens": 64}}, format="json")
    admin_api.delete(f"/api/v1/tenants/acme/keys/{key_id}/")
    admin_api.patch("/api/v1/deployments/demo/access", {"requires_key": True}, format="json")
    admin_api.delete("/api/v1/tenants/acme/")
    rows = list(Action.objects.filter(kind="tenant").order_by("id"))
    assert [row.params["verb"] for row in rows] == ["create", "key_issue", "update", "key_revoke", "access", "delete"]
    assert rows[0].reason == "first customer" and rows[0].actor == "ada-admin" and rows[0].status == "succeeded"
    assert rows[4].deployment_name == "demo"
    listed = admin_api.get("/api/v1/actions/")
    assert listed.status_code == 200
    assert [a["params"]["verb"] for a in listed.json()["results"] if a["kind"] == "tenant"][0] == "delete"


@pytest.mark.parametrize("fields,field", [
    ({"limits": {"requests_per_minute": 0}}, "limits.requests_per_minute"),
    ({"limits": {"tokens_per_minute": -5}}, "limits.tokens_per_minute"),
    ({"limits": {"max_tokens": 2.5}}, "limits.max_tokens"),
    ({"limits": {"max_concurrent_requests": True}}, "limits.max_concurrent_requests"),
    ({"limits": {"requests_per_day": 5}}, "limits.requests_per_day"),
    ({"limits": [60]}, "limits"),
    ({"priority_class": "urgent"}, "priority_class"),
    ({"deployments": ["nope"]}, "deployments"),
    ({"deployments": "demo"}, "deployments"),
    ({"name": "Not A Name"}, "name"),
])
def test_a_bad_value_is_a_400_naming_its_field(admin_api, deployment, fields, field):
    response = _create(admin_api, **fields)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    assert field.split(".")[-1] in response.json()["error"]["message"]
    from controlplane.tenants.models import Tenant

    assert not Tenant.objects.exists()


def test_a_taken_name_is_a_409(admin_api, deployment):
    assert _create(admin_api).status_code == 201
    response = _create(admin_api)
    assert response.status_code == 409 and response.json()["error"]["field"] == "name"


def test_tenants_beyond_the_cap_are_refused_so_the_tenant_label_stays_bounded(admin_api, deployment, settings):
    from controlplane.tenants.models import Tenant

    settings.TANDEM_MAX_TENANTS = 2
    assert _create(admin_api, name="one").status_code == 201
    assert _create(admin_api, name="two").status_code == 201
    response = _create(admin_api, name="three")
    assert response.status_code == 409 and "TANDEM_MAX_TENANTS" in response.json()["error"]["message"]
    assert sorted(Tenant.objects.values_list("name", flat=True)) == ["one", "two"]


def test_a_patch_changes_the_limits_it_names_and_null_removes_one(admin_api, deployment):
    _create(admin_api)
    response = admin_api.patch("/api/v1/tenants/acme/", {"limits": {"requests_per_minute": None, "max_tokens": 32},
                                                         "priority_class": "batch"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["limits"] == {"tokens_per_minute": 10000, "max_tokens": 32}
    assert response.json()["priority_class"] == "batch"
    bad = admin_api.patch("/api/v1/tenants/acme/", {"limits": {"max_tokens": 0}}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "limits.max_tokens"


def test_a_key_is_shown_once_and_stored_as_its_sha256(admin_api, viewer_api, deployment):
    from controlplane.tenants.models import TenantKey

    _create(admin_api)
    response = admin_api.post("/api/v1/tenants/acme/keys/", {"name": "ci"}, format="json")
    assert response.status_code == 201, response.content
    key = response.json()["key"]
    assert len(key) > 30 and response.json()["active"] is True
    row = TenantKey.objects.get()
    assert row.key_hash == hashlib.sha256(key.encode()).hexdigest()
    assert key not in str(list(TenantKey.objects.values()))
    for api in (admin_api, viewer_api):
        listed = api.get("/api/v1/tenants/acme/keys/")
        assert listed.status_code == 200 and key not in listed.content.decode()
        assert listed.json()[0]["prefix"] == key[:10]
        one = api.get(f"/api/v1/tenants/acme/keys/{row.pk}/")
        assert one.status_code == 200 and key not in one.content.decode()


def test_a_revoked_key_stays_listed_as_revoked(admin_api, deployment):
    _create(admin_api)
    key_id = admin_api.post("/api/v1/tenants/acme/keys/", {}, format="json").json()["id"]
    response = admin_api.delete(f"/api/v1/tenants/acme/keys/{key_id}/")
    assert response.status_code == 200, response.content
    assert response.json()["active"] is False and response.json()["revoked_at"]
    assert admin_api.get("/api/v1/tenants/acme/").json()["num_active_keys"] == 0


def test_an_expiry_in_the_past_or_without_a_time_zone_is_a_400(admin_api, deployment):
    _create(admin_api)
    past = admin_api.post("/api/v1/tenants/acme/keys/", {"expires_at": "2020-01-01T00:00:00Z"}, format="json")
    assert past.status_code == 400 and past.json()["error"]["field"] == "expires_at"
    assert "past" in past.json()["error"]["message"]


def test_a_repeated_idempotency_key_does_not_issue_a_second_key_it_cannot_show(admin_api, deployment):
    from controlplane.tenants.models import TenantKey

    _create(admin_api)
    first = admin_api.post("/api/v1/tenants/acme/keys/", {}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = admin_api.post("/api/v1/tenants/acme/keys/", {}, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == 201 and again.status_code == 409, again.content
    assert again.json()["error"]["key_id"] == first.json()["id"]
    assert TenantKey.objects.count() == 1


def test_keys_of_a_deleted_tenant_are_gone_and_its_paths_answer_404(admin_api, deployment):
    from controlplane.tenants.models import TenantKey

    _create(admin_api)
    admin_api.post("/api/v1/tenants/acme/keys/", {}, format="json")
    assert admin_api.delete("/api/v1/tenants/acme/").status_code == 204
    assert not TenantKey.objects.exists()
    response = admin_api.post("/api/v1/tenants/acme/keys/", {}, format="json")
    assert response.status_code == 404 and "acme" in response.json()["error"]["message"]


def test_a_deployment_is_open_until_marked_and_requires_key_must_be_a_boolean(admin_api, viewer_api, deployment):
    assert viewer_api.get("/api/v1/deployments/demo/access").json() == {
        "deployment": "demo", "requires_key": False, "tenants": [], "admission": {}}
    bad = admin_api.patch("/api/v1/deployments/demo/access", {"requires_key": "yes"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "requires_key"
    _create(admin_api)
    response = admin_api.patch("/api/v1/deployments/demo/access", {"requires_key": True}, format="json")
    assert response.status_code == 200
    assert response.json() == {"deployment": "demo", "requires_key": True, "tenants": ["acme"], "admission": {}}
    assert admin_api.patch("/api/v1/deployments/nope/access", {"requires_key": True},
                           format="json").status_code == 404
