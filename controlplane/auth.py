"""Who may do what: roles, and the API tokens that name a user.

Roles are Django groups `viewer` < `operator` < `admin` (a superuser is admin). viewer reads everything; operator
also scales, restarts, drains and rolls back; admin also creates and deletes deployments and revisions, and manages
users and tokens (Django admin, `manage.py tandem_token`).

Tokens are DRF's authtoken keys. Besides the REST API's own `Authorization: Token <token>` (DRF's
TokenAuthentication), `token_for` accepts `Authorization: Bearer <token>`, which Prometheus (`authorization`,
`bearer_token`) and Alertmanager (`http_config.authorization`) send. It serves the Alertmanager receiver (through
BearerTokenAuthentication) and the control plane's /metrics alike.
"""
from __future__ import annotations

import enum
import hmac

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token
from rest_framework.permissions import BasePermission


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


def token_for(request) -> Token | None:
    """The token of an active user that `request` presents as `Authorization: Bearer <token>` or
    `Authorization: Token <token>`; None without such a header (another scheme, or none).

    Raises AuthenticationFailed for a malformed header or a token of no active user. The presented token is
    compared in constant time with every active user's token, without stopping at a match, rather than looked up by
    key: the time taken says nothing about how much of a guessed token was right.
    """
    header = authentication.get_authorization_header(request).split()
    if not header or header[0].lower() not in TOKEN_SCHEMES:
        return None
    if len(header) != 2:
        raise exceptions.AuthenticationFailed("Authorization must be 'Bearer <token>' or 'Token <token>'")
    presented = header[1]
    if not presented.isascii():
        raise exceptions.AuthenticationFailed("the token must be ASCII")
    found = None
    for key, user_id in Token.objects.filter(user__is_active=True).values_list("key", "user_id"):
        if hmac.compare_digest(key.encode(), presented):
            found = user_id
    if found is None:
        raise exceptions.AuthenticationFailed("invalid token")
    return Token.objects.select_related("user").get(user_id=found)


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """DRF authentication by `token_for`: `Bearer <token>` (what Alertmanager sends) or `Token <token>`."""

    def authenticate(self, request):
        token = token_for(request)
        return None if token is None else (token.user, token)

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of BearerTokenAuthentication (registered when this module is imported)."""

    target_class = "controlplane.auth.BearerTokenAuthentication"
    name = "bearerToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "description": "The API token of an operator or admin."}
