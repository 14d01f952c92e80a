"""Abuse limits on the pages: a Content-Security-Policy that allows no inline or foreign script, and sign-in
locked out (django-axes) after repeated wrong passwords for one username from one address."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db
PASSWORD = "a-long-enough-password"


def _policy(response) -> dict[str, list[str]]:
    directives = [part.strip().split() for part in response["Content-Security-Policy"].split(";") if part.strip()]
    return {name: values for name, *values in directives}


def test_pages_carry_a_policy_with_no_inline_or_foreign_script(client_for, viewer, deployment):
    policy = _policy(client_for(viewer).get("/deployments/demo/"))
    assert policy["script-src"] == ["'self'"] and policy["default-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"] and policy["object-src"] == ["'none'"]


def test_the_api_docs_load_their_script_from_a_url_not_inline(client):
    html = client.get("/api/docs/").content.decode()
    assert "<script>" not in html.replace(" ", "") and "?script" in html
    script = client.get("/api/docs/?script=")
    assert script.status_code == 200 and script["Content-Type"].startswith("application/javascript")


def test_repeated_wrong_passwords_lock_that_username_out_from_that_address(client, make_user, settings):
    settings.AXES_FAILURE_LIMIT = 3
    user = make_user("pat", "viewer")
    user.set_password(PASSWORD)
    user.save()
    for _ in range(3):
        response = client.post("/accounts/login/", {"username": "pat", "password": "wrong"})
        assert response.status_code in (200, 429)
    locked = client.post("/accounts/login/", {"username": "pat", "password": PASSWORD})
    assert locked.status_code == 429 and "Too many failed sign-ins" in locked.content.decode()
    # Another user from the same address is not locked out by pat's failures.
    other = make_user("quinn", "viewer")
    other.set_password(PASSWORD)
    other.save()
    response = client.post("/accounts/login/", {"username": "quinn", "password": PASSWORD})
    assert response.status_code == 302


def test_a_good_password_resets_the_count(client, make_user, settings):
    settings.AXES_FAILURE_LIMIT = 3
    user = make_user("pat", "viewer")
    user.set_password(PASSWORD)
    user.save()
    for _ in range(2):
        client.post("/accounts/login/", {"username": "pat", "password": "wrong"})
    assert client.post("/accounts/login/", {"username": "pat", "password": PASSWORD}).status_code == 302
    client.logout()
    for _ in range(2):
        client.post("/accounts/login/", {"username": "pat", "password": "wrong"})
    assert client.post("/accounts/login/", {"username": "pat", "password": PASSWORD}).status_code == 302
