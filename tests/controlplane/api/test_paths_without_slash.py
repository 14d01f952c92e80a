"""The API answers its paths without the trailing slash as with it (no 301 that curl without -L prints as nothing,
and a POST that a redirect would lose), and /favicon.ico is no 404."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_a_path_without_its_slash_answers_as_with_it(viewer_api, deployment):
    slashed = viewer_api.get("/api/v1/deployments/demo/")
    bare = viewer_api.get("/api/v1/deployments/demo")
    assert bare.status_code == slashed.status_code == 200
    assert bare.json()["name"] == slashed.json()["name"] == "demo"


def test_a_post_without_the_slash_reaches_its_view(admin_api, deployment):
    response = admin_api.post("/api/v1/deployments/demo/scale", {"role": "decode", "replicas": 2}, format="json")
    assert response.status_code == 202, response.content
    assert admin_api.post("/api/v1/deployments", {}, format="json").status_code == 400  # the list's own 400


def test_an_unknown_path_is_still_a_404(viewer_api):
    assert viewer_api.get("/api/v1/no-such-thing").status_code == 404


def test_favicon_is_no_404(client):
    assert client.get("/favicon.ico").status_code == 204
