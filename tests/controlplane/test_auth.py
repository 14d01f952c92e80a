"""Roles are ordered groups: viewer < operator < admin; a superuser is admin; no group, no role."""
from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser, Group

from controlplane.auth import Role, has_role, role_of, set_role

pytestmark = pytest.mark.django_db


def test_each_role_and_the_outsider(viewer, operator, admin, outsider):
    assert [role_of(u) for u in (viewer, operator, admin, outsider)] == [Role.VIEWER, Role.OPERATOR, Role.ADMIN,
                                                                         None]
    assert role_of(AnonymousUser()) is None


def test_a_superuser_is_admin_without_a_group(django_user_model):
    root = django_user_model.objects.create_superuser("root", "root@example.com", None)
    assert role_of(root) is Role.ADMIN


def test_the_highest_group_wins(operator):
    operator.groups.add(Group.objects.get(name="viewer"))
    operator.refresh_from_db()
    assert role_of(operator) is Role.OPERATOR


def test_an_inactive_user_has_no_role(admin):
    admin.is_active = False
    assert role_of(admin) is None


def test_set_role_replaces_the_previous_one(admin):
    set_role(admin, Role.VIEWER)
    assert sorted(admin.groups.values_list("name", flat=True)) == ["viewer"]
    assert has_role(admin, Role.VIEWER) and not has_role(admin, Role.OPERATOR)
