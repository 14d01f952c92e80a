"""controlplane.auth.token_for, the one reader of API tokens: `Bearer <token>` and `Token <token>` name an active
user's token, looked up by its hash; anything else is no token or a refusal; a client that keeps failing is
throttled (429) while good tokens keep working, from that very address too; the address is the connection's, not an
X-Forwarded-For header as sent (unless behind TANDEM_TRUSTED_PROXIES)."""
from __future__ import annotations

import pytest
from django.test import RequestFactory
from rest_framework.exceptions import AuthenticationFailed, Throttled

from controlplane.auth import BearerTokenAuthentication, TokenAuthentication, token_for
from controlplane.services.tokens import token_issue

pytestmark = pytest.mark.django_db


def request_with(header: str | None, address: str = "192.0.2.1", **meta):
    extra = {**meta} if header is None else {"HTTP_AUTHORIZATION": header, **meta}
    return RequestFactory().get("/", REMOTE_ADDR=address, **extra)


def test_both_schemes_name_the_users_token(operator):
    key = token_issue(user=operator, name="t")
    for scheme in ("Bearer", "bearer", "Token"):
        assert token_for(request_with(f"{scheme} {key}")).user == operator
    for authentication in (TokenAuthentication(), BearerTokenAuthentication()):
        user, token = authentication.authenticate(request_with(f"Bearer {key}"))
        assert (user, token.prefix) == (operator, key[:6])


def test_no_header_or_another_scheme_is_no_token(operator):
    token_issue(user=operator, name="t")
    assert token_for(request_with(None)) is None
    assert token_for(request_with("Basic b3A6cGFzcw==")) is None


@pytest.mark.parametrize("header", ["Bearer", "Bearer a b", "Bearer " + "0" * 40, "Token caf\u00e9"])
def test_a_malformed_header_or_an_unknown_token_is_refused(operator, header):
    token_issue(user=operator, name="t")
    with pytest.raises(AuthenticationFailed):
        token_for(request_with(header))


def test_the_token_of_an_inactive_user_is_refused(operator):
    key = token_issue(user=operator, name="t")
    operator.is_active = False
    operator.save()
    with pytest.raises(AuthenticationFailed):
        token_for(request_with(f"Bearer {key}"))


def test_a_client_that_keeps_guessing_is_throttled_and_others_are_not(operator, settings):
    settings.TANDEM_FAILED_TOKEN_RATE = "5/min"
    key = token_issue(user=operator, name="t")
    for _ in range(5):
        with pytest.raises(AuthenticationFailed):
            token_for(request_with("Token wrong-guess"))
    assert token_for(request_with(f"Token {key}", address="192.0.2.9")).user == operator  # another client
    with pytest.raises(Throttled) as throttled:
        token_for(request_with("Token another-guess"))  # this client's guesses, until the window passes
    assert 0 < throttled.value.wait <= 60
    # A valid key is never refused, whoever shares the address (a NAT) or failed from it.
    assert token_for(request_with(f"Token {key}")).user == operator


def test_a_forged_forwarded_for_header_cannot_aim_the_throttle_at_others(operator, settings):
    settings.TANDEM_FAILED_TOKEN_RATE = "3/min"
    for _ in range(3):  # an attacker at 192.0.2.66 claims to be 203.0.113.7
        with pytest.raises(AuthenticationFailed):
            token_for(request_with("Token wrong", address="192.0.2.66", HTTP_X_FORWARDED_FOR="203.0.113.7"))
    with pytest.raises(AuthenticationFailed):  # 203.0.113.7 itself is not blocked: its guesses still count as 401s
        token_for(request_with("Token wrong", address="203.0.113.7"))
    with pytest.raises(Throttled):  # the attacker's own connection is
        token_for(request_with("Token wrong", address="192.0.2.66", HTTP_X_FORWARDED_FOR="198.51.100.1"))


def test_behind_trusted_proxies_the_address_they_appended_counts(operator, settings):
    settings.TANDEM_FAILED_TOKEN_RATE = "2/min"
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    for _ in range(2):  # two clients behind one proxy (10.0.0.1), told apart by what the proxy appended
        with pytest.raises(AuthenticationFailed):
            token_for(request_with("Token wrong", address="10.0.0.1", HTTP_X_FORWARDED_FOR="forged, 203.0.113.8"))
    with pytest.raises(AuthenticationFailed):
        token_for(request_with("Token wrong", address="10.0.0.1", HTTP_X_FORWARDED_FOR="198.51.100.1"))
    with pytest.raises(Throttled):
        token_for(request_with("Token wrong", address="10.0.0.1", HTTP_X_FORWARDED_FOR="203.0.113.8"))


def test_good_tokens_are_never_counted(operator, settings):
    settings.TANDEM_FAILED_TOKEN_RATE = "2/min"
    key = token_issue(user=operator, name="t")
    for _ in range(10):
        assert token_for(request_with(f"Token {key}")).user == operator


def test_the_api_answers_a_throttled_client_429_with_retry_after(api_for, operator, client, settings):
    settings.TANDEM_FAILED_TOKEN_RATE = "3/min"
    for _ in range(3):
        assert client.get("/api/v1/deployments/", HTTP_AUTHORIZATION="Token nope").status_code == 401
    response = client.get("/api/v1/deployments/", HTTP_AUTHORIZATION="Token nope")
    assert response.status_code == 429 and int(response["Retry-After"]) > 0
    assert response.json()["error"]["message"].startswith("too many requests with an invalid token")


def test_metrics_answers_a_throttled_client_429_too(viewer, client, settings):
    settings.TANDEM_FAILED_TOKEN_RATE = "2/min"
    for _ in range(2):
        assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 401
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer nope")
    assert response.status_code == 429 and int(response["Retry-After"]) > 0
