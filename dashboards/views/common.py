"""Helpers shared by the page views."""
from __future__ import annotations

import uuid

from django.shortcuts import render
from django.utils.http import url_has_allowed_host_and_scheme

from dashboards.access import can_administer, can_operate


def page(request, template: str, context: dict | None = None, *, status: int = 200):
    """Render a page with the role flags every template uses to show or hide buttons."""
    context = dict(context or {})
    context.setdefault("role", getattr(request, "role", None))
    context["can_operate"] = can_operate(request)
    context["can_administer"] = can_administer(request)
    context["form_key"] = new_form_key
    return render(request, template, context, status=status)


def new_form_key() -> str:
    """An idempotency key per rendered form: a double click or a re-sent POST makes one action, not two."""
    return f"dash-{uuid.uuid4().hex}"


def posted_key(request) -> str | None:
    """The form's idempotency key, scoped to the signed-in user as the API's are."""
    from controlplane.services.actions import user_idempotency_key

    key = (request.POST.get("idempotency_key") or "").strip()
    return user_idempotency_key(request.user, key[:255] or None)


def safe_next(request, default: str) -> str:
    """Where to go after a POST: the posted `next` when it is a local URL, else `default`."""
    target = request.POST.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()},
                                                  require_https=request.is_secure()):
        return target
    return default
