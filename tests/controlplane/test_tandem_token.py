"""`manage.py tandem_token USERNAME --role ROLE` prints only a new token, creating the user if needed; only the
token's hash is stored."""
from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from controlplane.auth import Role, role_of
from controlplane.models import ApiToken
from controlplane.services.tokens import key_hash

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command("tandem_token", *args, stdout=out, stderr=err)
    return out.getvalue()


def test_it_creates_the_user_with_the_role_and_prints_only_the_token():
    printed = run("ci-bot", "--role", "operator")
    user = get_user_model().objects.get(username="ci-bot")
    token = ApiToken.objects.get(user=user)
    assert printed == f"{token.prefix}{printed[6:]}" and token.key_hash == key_hash(printed.strip())
    assert printed.strip() not in str(list(ApiToken.objects.values()))  # stored hashed, never as the key
    assert role_of(user) is Role.OPERATOR
    assert not user.has_usable_password()


def test_running_it_again_changes_the_role_and_adds_a_token_leaving_the_first_valid(client):
    first = run("ci-bot", "--role", "admin").strip()
    second = run("ci-bot", "--role", "viewer").strip()
    assert first != second
    assert role_of(get_user_model().objects.get(username="ci-bot")) is Role.VIEWER
    for key in (first, second):
        assert client.get("/api/v1/deployments/", HTTP_AUTHORIZATION=f"Token {key}").status_code == 200


def test_rotate_revokes_the_other_tokens(client):
    first = run("ci-bot", "--role", "viewer").strip()
    rotated = run("ci-bot", "--role", "viewer", "--rotate").strip()
    assert rotated != first
    assert client.get("/api/v1/deployments/", HTTP_AUTHORIZATION=f"Token {first}").status_code == 401
    assert client.get("/api/v1/deployments/", HTTP_AUTHORIZATION=f"Token {rotated}").status_code == 200


def test_the_printed_token_works_against_the_api(client):
    token = run("reader", "--role", "viewer").strip()
    response = client.get("/api/v1/deployments/", HTTP_AUTHORIZATION=f"Token {token}")
    assert response.status_code == 200


def test_an_unknown_role_is_refused():
    with pytest.raises(CommandError):
        run("ci-bot", "--role", "root")


def test_an_invalid_username_is_refused():
    with pytest.raises(CommandError, match="invalid username"):
        run("bad name!", "--role", "viewer")
