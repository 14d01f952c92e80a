"""Who may do what: roles, and the API tokens that name a user.

Roles are Django groups `viewer` < `operator` < `admin` (a superuser is admin). viewer reads everything; operator
also scales, restarts, drains and rolls back; admin also creates and deletes deployments and revisions, and manages
users and tokens (Django admin, `manage.py tandem_token`).

Tokens are stored hashed (controlplane.services.tokens). `token_for` is the one reader: it accepts the REST API's
`Authorization: Token <token>` and `Authorization: Bearer <token>`, which Prometheus (`authorization`,
`bearer_token`) and Alertmanager (`http_config.authorization`) send, and it throttles clients that keep presenting
bad tokens. It serves the REST API, the Alertmanager receiver and the control plane's /metrics alike.
"""
from __future__ import annotations

import enum

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.permissions import BasePermission
from rest_framework.throttling import SimpleRateThrottle

from controlplane.models import ApiToken
from controlplane.services.tokens import key_hash


class Role(enum.IntEnum):
    # Ordered: a higher role may do everything a lower one may.
    VIEWER = 1
    OPERATOR = 2
    ADMIN = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, name: str) -> "Role":
        try:
            return cls[name.upper()]
        except KeyError:
            raise ValueError(f"unknown role {name!r}: choose viewer, operator or admin") from None


ROLE_GROUPS = tuple(role.label for role in Role)


def role_of(user) -> Role | None:
    """The highest role of `user`, or None for anonymous users and users in no role group (outsiders)."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    if user.is_superuser:
        return Role.ADMIN
    # Cached per user object: a request asks several times (permission, then the view).
    cached = getattr(user, "_tandem_role", False)
    if cached is not False:
        return cached
    names = set(user.groups.filter(name__in=ROLE_GROUPS).values_list("name", flat=True))
    role = max((Role.parse(name) for name in names), default=None)
    user._tandem_role = role
    return role


def has_role(user, needed: Role) -> bool:
    role = role_of(user)
    return role is not None and role >= needed


def set_role(user, role: Role) -> None:
    """Put `user` in exactly one role group."""
    from django.contrib.auth.models import Group

    ensure_role_groups()
    user.groups.remove(*Group.objects.filter(name__in=ROLE_GROUPS))
    user.groups.add(Group.objects.get(name=role.label))
    if hasattr(user, "_tandem_role"):
        del user._tandem_role


def ensure_role_groups(**kwargs) -> None:
    """Create the role groups (post_migrate receiver, also safe to call any time)."""
    from django.contrib.auth.models import Group

    for name in ROLE_GROUPS:
        Group.objects.get_or_create(name=name)


class _HasRole(BasePermission):
    role: Role

    def has_permission(self, request, view) -> bool:
        return has_role(request.user, self.role)

    @property
    def message(self) -> str:
        return f"This needs the {self.role.label} role (or higher)."


class IsViewer(_HasRole):
    role = Role.VIEWER


class IsOperator(_HasRole):
    role = Role.OPERATOR


class IsAdmin(_HasRole):
    role = Role.ADMIN


TOKEN_SCHEMES = (b"bearer", b"token")


class FailedTokenThrottle(SimpleRateThrottle):
    """Failed token lookups per client address (TANDEM_FAILED_TOKEN_RATE, e.g. 20/min): past the rate, every
    request of that client that presents an invalid token is answered 429 until the window has passed, so keys
    cannot be guessed at the speed of the network. Only failures count, and a valid token is never refused: an
    address can be shared (a NAT, a proxy) or forged, and nobody's bad guesses may lock out a good key. The address
    is the connection's; X-Forwarded-For counts only behind TANDEM_TRUSTED_PROXIES proxies (DRF's NUM_PROXIES)."""

    scope = "failed_token"

    def get_rate(self):
        return settings.TANDEM_FAILED_TOKEN_RATE

    def get_cache_key(self, request, view=None):
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    def blocked(self, request) -> float | None:
        """Seconds to wait when this client is over the rate, else None. Records nothing."""
        self.key = self.get_cache_key(request)
        self.history = self.cache.get(self.key, [])
        self.now = self.timer()
        while self.history and self.history[-1] <= self.now - self.duration:
            self.history.pop()
        return self.wait() if len(self.history) >= self.num_requests else None

    def record(self, request) -> None:
        self.blocked(request)
        self.throttle_success()


def token_for(request) -> ApiToken | None:
    """The token of an active user that `request` presents as `Authorization: Bearer <token>` or
    `Authorization: Token <token>`; None without such a header (another scheme, or none).

    Raises AuthenticationFailed for a malformed header or a key of no active user, and Throttled while the client
    has failed too often (FailedTokenThrottle). Keys are looked up by their SHA-256 (controlplane.services.tokens).
    """
    header = authentication.get_authorization_header(request).split()
    if not header or header[0].lower() not in TOKEN_SCHEMES:
        return None
    token = None
    if len(header) == 2 and header[1].isascii():
        token = (ApiToken.objects.select_related("user")
                 .filter(key_hash=key_hash(header[1].decode()), user__is_active=True).first())
    if token is not None:
        return token
    throttle = FailedTokenThrottle()
    wait = throttle.blocked(request)
    if wait is not None:
        raise exceptions.Throttled(wait, detail="too many requests with an invalid token from this address")
    throttle.record(request)
    if len(header) != 2:
        raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <token>' or 'Token <token>'")
    raise exceptions.AuthenticationFailed("Invalid token.")


class TokenAuthentication(authentication.BaseAuthentication):
    """DRF authentication by `token_for`: `Token <token>` (the REST API's scheme) or `Bearer <token>`."""

    def authenticate(self, request):
        token = token_for(request)
        return None if token is None else (token.user, token)

    def authenticate_header(self, request) -> str:
        return "Token"


class BearerTokenAuthentication(TokenAuthentication):
    """The same, announcing `Bearer` in a 401 (what Alertmanager and Prometheus send)."""

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class TokenScheme(OpenApiAuthenticationExtension):
    target_class = "controlplane.auth.TokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": "Authorization",
                "description": "`Token <key>` (or `Bearer <key>`): an API token from `manage.py tandem_token`."}


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of BearerTokenAuthentication (registered when this module is imported)."""

    target_class = "controlplane.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "The API token of an operator or admin."}
