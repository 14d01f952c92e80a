"""The Django admin shows the fleet read-only (changes go through services) and lists every model."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def superuser_client(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", "root@example.com", None))
    return client


@pytest.mark.parametrize("model", ["deployment", "revision", "node", "worker", "action"])
def test_each_fleet_page_lists_and_offers_no_add(superuser_client, deployment, make_worker, model):
    make_worker(deployment, "decode")
    response = superuser_client.get(f"/admin/controlplane/{model}/")
    assert response.status_code == 200
    assert superuser_client.get(f"/admin/controlplane/{model}/add/").status_code == 403


def test_a_deployment_cannot_be_changed_in_the_admin(superuser_client, deployment):
    url = f"/admin/controlplane/deployment/{deployment.pk}/change/"
    assert superuser_client.get(url).status_code == 200  # viewable
    response = superuser_client.post(url, {"name": "renamed", "mode": "colocated"})
    assert response.status_code == 403
    deployment.refresh_from_db()
    assert deployment.name == "demo"


def test_users_and_tokens_are_managed_in_the_admin(superuser_client, operator):
    from controlplane.models import ApiToken
    from controlplane.services.tokens import token_issue

    assert superuser_client.get("/admin/auth/user/add/").status_code == 200
    key = token_issue(user=operator, name="cli")
    listing = superuser_client.get("/admin/controlplane/apitoken/")
    assert listing.status_code == 200 and key[:6] in listing.content.decode() and key not in listing.content.decode()
    # Keys are shown once, by tandem_token: the admin revokes, it never issues (and DRF's plain-key admin is gone).
    assert superuser_client.get("/admin/controlplane/apitoken/add/").status_code == 403
    assert superuser_client.get("/admin/authtoken/tokenproxy/").status_code == 404
    token = ApiToken.objects.get()
    superuser_client.post(f"/admin/controlplane/apitoken/{token.pk}/delete/", {"post": "yes"})
    assert not ApiToken.objects.exists()
