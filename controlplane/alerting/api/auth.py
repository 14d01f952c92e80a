"""`Authorization: Bearer <token>` for the Alertmanager receiver: Alertmanager's `http_config.authorization`
sends a bearer token, while DRF's TokenAuthentication expects the keyword `Token`. The token is an ordinary API token
(`manage.py tandem_token USER --role operator`)."""
from __future__ import annotations

import hmac

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <token>'")
        try:
            presented = header[1].decode()
        except UnicodeError:
            raise exceptions.AuthenticationFailed("the token must be ASCII") from None
        return self._user_for(presented)

    def _user_for(self, presented: str):
        from rest_framework.authtoken.models import Token

        # Compared in constant time against every active user's token, without stopping at a match, rather than
        # looked up by key: the time taken says nothing about how much of a guessed token was right.
        found = None
        for key, user_id in Token.objects.filter(user__is_active=True).values_list("key", "user_id"):
            if hmac.compare_digest(key.encode(), presented.encode()):
                found = user_id
        if found is None:
            raise exceptions.AuthenticationFailed("invalid token")
        token = Token.objects.select_related("user").get(user_id=found)
        return token.user, token

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of BearerTokenAuthentication (registered when this module is imported)."""

    target_class = "controlplane.alerting.api.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "The API token of an operator or admin."}
