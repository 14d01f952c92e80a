"""The one domain error. Services raise it; the API's exception handler (controlplane.api.exceptions) turns it
into `{"error": {"message", "code", ...extra}}` with its HTTP status; the dashboard shows the message."""
from __future__ import annotations

_DEFAULT_CODES = {400: "invalid", 403: "forbidden", 404: "not_found", 409: "conflict", 422: "unprocessable"}


class ControlPlaneError(Exception):
    def __init__(self, message: str, *, status: int = 400, code: str | None = None, extra: dict | None = None):
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code or _DEFAULT_CODES.get(status, "error")
        self.extra = dict(extra or {})

    def __repr__(self) -> str:
        return f"ControlPlaneError({self.message!r}, status={self.status}, code={self.code!r})"


def not_found(message: str, **extra) -> ControlPlaneError:
    return ControlPlaneError(message, status=404, extra=extra)


def conflict(message: str, **extra) -> ControlPlaneError:
    return ControlPlaneError(message, status=409, extra=extra)


def invalid(message: str, *, field: str | None = None, **extra) -> ControlPlaneError:
    if field is not None:
        extra["field"] = field
    return ControlPlaneError(message, status=400, extra=extra)
