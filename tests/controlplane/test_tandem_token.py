"""`manage.py tandem_token USERNAME --role ROLE` prints only the token, creating the user if needed."""
from __future__ import annotations

import io

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from rest_framework.authtoken.models import Token

from controlplane.auth import Role, role_of

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command("tandem_token", *args, stdout=out, stderr=err)
    return out.getvalue()


def test_it_creates_the_user_with_the_role_and_prints_only_the_token():
    printed = run("ci-bot", "--role", "operator")
    user = get_user_model().objects.get(username="ci-bot")
    assert printed == Token.objects.get(user=user).key + "\n"
    assert role_of(user) is Role.OPERATOR
    assert not user.has_usable_password()


def test_running_it_again_changes_the_role_and_keeps_the_token():
    first = run("ci-bot", "--role", "admin")
    second = run("ci-bot", "--role", "viewer")
    assert first == second
    assert role_of(get_user_model().objects.get(username="ci-bot")) is Role.VIEWER


def test_rotate_gives_a_new_token():
    first = run("ci-bot", "--role", "viewer")
    assert run("ci-bot", "--role", "viewer", "--rotate") != first


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
