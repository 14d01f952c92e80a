"""Roles: Django groups `viewer` < `operator` < `admin` (a superuser is admin).

viewer reads everything; operator also scales, restarts, drains and rolls back; admin also creates and deletes
deployments and revisions, and manages users and tokens (Django admin, `manage.py tandem_token`).
"""
from __future__ import annotations

import enum

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
