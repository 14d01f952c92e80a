"""Every endpoint × every role: anonymous gets 401, a role without the right 403 naming the role it needs, a role
with the right gets the endpoint's success status."""
from __future__ import annotations

import pytest

from tests.page_assets import foreign_assets

ANON, OUTSIDER, VIEWER, OPERATOR, ADMIN = "anonymous", "outsider", "viewer", "operator", "admin"
RANK = {OUTSIDER: 0, VIEWER: 1, OPERATOR: 2, ADMIN: 3}

# (method, url template, body, role needed, status when allowed)
ENDPOINTS = [
    ("get", "/api/v1/nodes/", None, VIEWER, 200),
    ("get", "/api/v1/nodes/local/", None, VIEWER, 200),
    ("get", "/api/v1/deployments/", None, VIEWER, 200),
    ("post", "/api/v1/deployments/", "CREATE", ADMIN, 202),
    ("get", "/api/v1/deployments/demo/", None, VIEWER, 200),
    ("delete", "/api/v1/deployments/demo/", None, ADMIN, 202),
    ("get", "/api/v1/deployments/demo/revisions/", None, VIEWER, 200),
    ("post", "/api/v1/deployments/demo/revisions/", {"comment": "again"}, ADMIN, 202),
    ("post", "/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 2}, OPERATOR, 202),
    ("post", "/api/v1/deployments/demo/rollback", {"revision": 1}, OPERATOR, 202),
    ("get", "/api/v1/deployments/demo/endpoints", None, VIEWER, 200),
    ("get", "/api/v1/workers/", None, VIEWER, 200),
    ("get", "/api/v1/workers/{worker}/", None, VIEWER, 200),
    ("post", "/api/v1/workers/{worker}/restart", {}, OPERATOR, 202),
    ("post", "/api/v1/workers/{worker}/drain", {}, OPERATOR, 202),
    ("get", "/api/v1/actions/", None, VIEWER, 200),
    ("get", "/api/v1/actions/{action}/", None, VIEWER, 200),
]


@pytest.fixture
def world(deployment, second_revision, make_worker, model_dir):
    worker = make_worker(deployment, "decode", status="ready")
    from controlplane.models import Action

    return {"worker": worker.pk, "action": Action.objects.latest("id").pk, "model_dir": str(model_dir)}


def _call(client, method, url, body, world):
    url = url.format(**world)
    if body == "CREATE":
        body = {"name": "fresh", "mode": "colocated", "model_path": world["model_dir"]}
    return getattr(client, method)(url, body, format="json") if body is not None else getattr(client, method)(url)


@pytest.mark.django_db
@pytest.mark.parametrize("method,url,body,needed,ok_status", ENDPOINTS, ids=[f"{m} {u}" for m, u, *_ in ENDPOINTS])
@pytest.mark.parametrize("who", [ANON, OUTSIDER, VIEWER, OPERATOR, ADMIN])
def test_each_role_gets_what_its_role_allows(who, method, url, body, needed, ok_status, world, api_for, request,
                                             node):
    user = None if who == ANON else request.getfixturevalue(who)
    response = _call(api_for(user), method, url, body, world)
    if who == ANON:
        assert response.status_code == 401, response.content
        assert response["WWW-Authenticate"].startswith("Token")
        assert response.json()["error"]["code"] == "not_authenticated"
    elif RANK[who] < RANK[needed]:
        assert response.status_code == 403, response.content
        assert f"the {needed} role" in response.json()["error"]["message"]
    else:
        assert response.status_code == ok_status, response.content


@pytest.mark.django_db
def test_a_session_write_without_csrf_token_is_refused(operator, deployment):
    from rest_framework.test import APIClient

    client = APIClient(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 2}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["error"]["message"]
    assert client.get("/api/v1/deployments/demo/").status_code == 200


@pytest.mark.django_db
def test_a_wrong_token_is_401_not_anonymous_access(deployment):
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    response = client.get("/api/v1/deployments/")
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "Invalid token."


@pytest.mark.django_db
def test_the_schema_and_docs_are_readable_without_a_token(anon_api):
    schema = anon_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert schema.status_code == 200
    assert "/api/v1/deployments/{name}/scale" in schema.json()["paths"]
    docs = anon_api.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    # Assets come from this server (drf-spectacular-sidecar), never a CDN.
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html
    assert foreign_assets(html) == []
    from django.contrib.staticfiles import finders

    assert finders.find("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")


@pytest.mark.django_db
def test_healthz_needs_no_token(anon_api):
    response = anon_api.get("/healthz")
    assert response.status_code == 200
    assert response.json()["database"] == "ok"  # whether ok or degraded is observability/test_healthz.py's
