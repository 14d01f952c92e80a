"""The fleet overview at `/` and a deployment's page: login required; deployments, pools, workers."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_anonymous_visitors_are_sent_to_the_login_page(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/?next=/")
    assert client.get("/accounts/login/").status_code == 200


def test_a_viewer_sees_each_deployment_its_pools_and_workers(client, viewer, deployment, make_worker):
    worker = make_worker(deployment, "decode", status="ready", last_error="")
    client.force_login(viewer)
    html = client.get("/").content.decode()
    assert "demo" in html and "prefill" in html and "decode" in html
    assert "vera-viewer" in html
    html = client.get("/deployments/demo/").content.decode()
    assert "disaggregated" in html and worker.url in html


def test_an_outsider_is_told_to_ask_for_a_role(client, outsider):
    client.force_login(outsider)
    assert "has no role yet" in client.get("/").content.decode()
