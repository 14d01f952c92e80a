"""Who may see and press what, the same roles as the REST API (controlplane.auth): viewers read, operators act
(scale, restart, drain, roll back, autoscaler, silences), admins also edit alert rules.

Anonymous visitors are sent to the login page; a signed-in user without a role gets a 403 page that says so.
A write by a role too low is refused by the server with 403 whatever the page showed.
"""
from __future__ import annotations

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from controlplane.auth import Role, role_of


def _guard(needed: Role, *, methods: tuple[str, ...] | None = None):
    def decorator(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            role = role_of(request.user)
            if role is None:
                return render(request, "dashboards/no_role.html", status=403)
            request.role = role
            if (methods is None or request.method in methods) and role < needed:
                raise PermissionDenied(f"This needs the {needed.label} role (or higher); you are a {role.label}.")
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def viewer_required(view):
    """GET pages: any role reads them."""
    return _guard(Role.VIEWER)(view)


def operator_required(view):
    """Buttons: operator or admin."""
    return _guard(Role.OPERATOR)(view)


def admin_for_writes(view):
    """Readable by viewers; POST needs admin (alert rules, as in the API)."""
    return _guard(Role.ADMIN, methods=("POST",))(view)


def can_operate(request) -> bool:
    role = getattr(request, "role", None) or role_of(request.user)
    return role is not None and role >= Role.OPERATOR


def can_administer(request) -> bool:
    role = getattr(request, "role", None) or role_of(request.user)
    return role is not None and role >= Role.ADMIN
