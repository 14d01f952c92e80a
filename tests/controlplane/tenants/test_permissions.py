"""The tenants endpoints × every role, as tests/controlplane/api/test_permissions.py does for the core's: anonymous
gets 401, a role below the one needed 403 naming it, the right role the endpoint's success status."""
from __future__ import annotations

import pytest

from tests.controlplane.api.test_permissions import ADMIN, ANON, OPERATOR, OUTSIDER, RANK, VIEWER

ENDPOINTS = [
    ("get", "/api/v1/tenants/", None, VIEWER, 200),
    ("post", "/api/v1/tenants/", {"name": "fresh", "deployments": ["demo"]}, ADMIN, 201),
    ("get", "/api/v1/tenants/acme/", None, VIEWER, 200),
    ("patch", "/api/v1/tenants/acme/", {"limits": {"max_tokens": 8}}, ADMIN, 200),
    ("delete", "/api/v1/tenants/acme/", None, ADMIN, 204),
    ("get", "/api/v1/tenants/acme/keys/", None, VIEWER, 200),
    ("post", "/api/v1/tenants/acme/keys/", {"name": "ci"}, ADMIN, 201),
    ("get", "/api/v1/tenants/acme/keys/{key}/", None, VIEWER, 200),
    ("delete", "/api/v1/tenants/acme/keys/{key}/", None, ADMIN, 200),
    ("get", "/api/v1/deployments/demo/access", None, VIEWER, 200),
    ("patch", "/api/v1/deployments/demo/access", {"requires_key": True}, ADMIN, 200),
    ("patch", "/api/v1/deployments/demo/access", {"admission": {"max_queued": 8}}, ADMIN, 200),
]


@pytest.fixture
def world(deployment, admin):
    from controlplane.tenants.services import tenant_create, tenant_key_issue

    tenant = tenant_create(name="acme", deployments=["demo"], actor=admin)
    row, _ = tenant_key_issue(tenant=tenant, actor=admin)
    return {"key": row.pk}


@pytest.mark.django_db
@pytest.mark.parametrize("method,url,body,needed,ok_status", ENDPOINTS, ids=[f"{m} {u}" for m, u, *_ in ENDPOINTS])
@pytest.mark.parametrize("who", [ANON, OUTSIDER, VIEWER, OPERATOR, ADMIN])
def test_each_role_gets_what_its_role_allows(who, method, url, body, needed, ok_status, world, api_for, request):
    user = None if who == ANON else request.getfixturevalue(who)
    client = api_for(user)
    url = url.format(**world)
    response = getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)
    if who == ANON:
        assert response.status_code == 401, response.content
        assert response.json()["error"]["code"] == "not_authenticated"
    elif RANK[who] < RANK[needed]:
        assert response.status_code == 403, response.content
        assert f"the {needed} role" in response.json()["error"]["message"]
    else:
        assert response.status_code == ok_status, response.content
    if method == "post" and url.endswith("/keys/") and response.status_code == 201:
        assert response.json()["key"]
    elif method == "get" and "keys" in url:
        assert '"key"' not in response.content.decode()  # a key is in the answer of its creation only
