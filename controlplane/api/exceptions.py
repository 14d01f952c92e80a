"""One exception handler: every API error is `{"error": {"message", "code", ...}}` with its HTTP status."""
from __future__ import annotations

import logging

from django.conf import settings
from django.core.exceptions import ObjectDoesNotExist, RequestDataTooBig
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import InternalError, OperationalError
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from controlplane.errors import ControlPlaneError

log = logging.getLogger(__name__)
DATABASE_RETRY_AFTER_S = 5


def _flatten(detail, prefix: str = "") -> dict[str, list[str]]:
    """{"engine_settings": {"threads": ["..."]}} → {"engine_settings.threads": ["..."]}."""
    if isinstance(detail, dict):
        flat: dict[str, list[str]] = {}
        for key, value in detail.items():
            name = str(key) if key != "non_field_errors" else ""
            flat.update(_flatten(value, f"{prefix}.{name}" if prefix and name else (name or prefix)))
        return flat
    if isinstance(detail, list) and detail and all(isinstance(item, (dict, list)) for item in detail):
        flat = {}
        for index, value in enumerate(detail):
            flat.update(_flatten(value, f"{prefix}[{index}]"))
        return flat
    items = detail if isinstance(detail, list) else [detail]
    return {prefix: [str(item) for item in items]}


def exception_handler(exc, context):
    if isinstance(exc, ControlPlaneError):
        return Response({"error": {"message": exc.message, "code": exc.code, **exc.extra}}, status=exc.status)
    if isinstance(exc, RequestDataTooBig):
        # Django's own answer is its HTML 400 page; an API client gets the API's JSON error and the real status.
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response({"error": {"message": f"the request body is larger than {limit} bytes", "code": "too_large",
                                   "max_bytes": limit}}, status=413)
    if isinstance(exc, (OperationalError, InternalError)):
        # The database refuses the request (read-only, out of connections, gone): nothing was applied (the
        # statement failed inside its transaction), and the client should retry, not read a 500 HTML page.
        # ProgrammingError and the like stay 500s: those are bugs.
        reason = (str(exc).strip().splitlines() or [""])[0][:200]
        log.warning("the database refused %s %s: %s", context["request"].method, context["request"].path, reason)
        return Response({"error": {"message": f"the database refuses this request for now ({type(exc).__name__}: "
                                              f"{reason}); nothing was changed: retry later",
                                   "code": "database_unavailable"}},
                        status=503, headers={"Retry-After": str(DATABASE_RETRY_AFTER_S)})
    if isinstance(exc, Http404):
        exc = exceptions.NotFound(str(exc) or "not found")
    elif isinstance(exc, ObjectDoesNotExist):
        # A row that a view found a moment ago was deleted before the service locked it (a concurrent delete).
        what = type(exc).__qualname__.split(".")[0].lower()
        exc = exceptions.NotFound(f"the {what} no longer exists (it was deleted meanwhile)")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # not an API error: a real bug, which Django reports as a 500
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail)
        message = "; ".join(f"{name}: {' '.join(msgs)}" if name else " ".join(msgs) for name, msgs in fields.items())
        body = {"message": message or "invalid input", "code": "invalid", "fields": fields}
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
        body = {"message": str(detail), "code": codes if isinstance(codes, str) else "error"}
    response.data = {"error": body}
    return response
