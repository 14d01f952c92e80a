"""Hostile bodies get the API's JSON error, never a 500 or an HTML page: JSON nested thousands deep (json.loads
raised RecursionError) and bodies over the size limit, on the REST API and the Alertmanager receiver alike."""
from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.django_db

ENDPOINTS = ["/api/v1/deployments/demo/scale", "/api/v1/webhooks/alertmanager"]


def _post(api, path, body: str):
    return api.generic("POST", path, body, content_type="application/json")


@pytest.fixture
def bearer_operator_api(api_for, operator):
    """The receiver takes `Authorization: Bearer`, as Alertmanager sends it; the API takes it too."""
    client = api_for(operator)
    token = client._credentials["HTTP_AUTHORIZATION"].split()[1]
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("depth", [5000, 100])
def test_deep_nesting_is_a_400_naming_the_limit(operator_api, bearer_operator_api, deployment, path, depth):
    api = bearer_operator_api if "alertmanager" in path else operator_api
    started = time.monotonic()
    response = _post(api, path, "[" * depth + "]" * depth)
    assert time.monotonic() - started < 5  # a parser that recursed or backtracked would take far longer, or fail
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "the JSON body nests deeper than 32 levels"


def test_ordinary_nesting_is_accepted(operator_api, deployment):
    body = json.dumps({"role": "decode", "replicas": 2, "reason": "x"})
    assert _post(operator_api, ENDPOINTS[0], body).status_code == 202


@pytest.mark.parametrize("path", ENDPOINTS)
def test_a_body_over_the_limit_is_a_413_in_json(operator_api, bearer_operator_api, deployment, settings, path):
    api = bearer_operator_api if "alertmanager" in path else operator_api
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    response = _post(api, path, json.dumps({"role": "decode", "replicas": 2, "reason": "a" * 20_000}))
    assert response.status_code == 413 and response["Content-Type"] == "application/json"
    assert response.json()["error"] == {"message": "the request body is larger than 10000 bytes",
                                        "code": "too_large", "max_bytes": 10000}
