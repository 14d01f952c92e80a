"""controlplane.auth.token_for, the one reader of API tokens besides DRF's own: `Bearer <token>` and
`Token <token>` name an active user's token; anything else is no token or a refusal."""
from __future__ import annotations

import pytest
from django.test import RequestFactory
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed

from controlplane.auth import BearerTokenAuthentication, token_for

pytestmark = pytest.mark.django_db


def request_with(header: str | None):
    extra = {} if header is None else {"HTTP_AUTHORIZATION": header}
    return RequestFactory().get("/", **extra)


def test_both_schemes_name_the_users_token(operator):
    key = Token.objects.create(user=operator).key
    for scheme in ("Bearer", "bearer", "Token"):
        assert token_for(request_with(f"{scheme} {key}")).user == operator
    user, token = BearerTokenAuthentication().authenticate(request_with(f"Bearer {key}"))
    assert (user, token.key) == (operator, key)


def test_no_header_or_another_scheme_is_no_token(operator):
    Token.objects.create(user=operator)
    assert token_for(request_with(None)) is None
    assert token_for(request_with("Basic b3A6cGFzcw==")) is None


@pytest.mark.parametrize("header", ["Bearer", "Bearer a b", "Bearer " + "0" * 40, "Token caf\u00e9"])
def test_a_malformed_header_or_an_unknown_token_is_refused(operator, header):
    Token.objects.create(user=operator)
    with pytest.raises(AuthenticationFailed):
        token_for(request_with(header))


def test_the_token_of_an_inactive_user_is_refused(operator):
    key = Token.objects.create(user=operator).key
    operator.is_active = False
    operator.save()
    with pytest.raises(AuthenticationFailed):
        token_for(request_with(f"Bearer {key}"))
