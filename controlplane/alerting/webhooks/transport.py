"""Outgoing HTTP: one POST with a timeout, and errors that say whether trying again can help."""
from __future__ import annotations

import requests


class TransportError(Exception):
    """A failed delivery try. `permanent`: the receiver said no in a way that another try will not change (404,
    410, other 4xx): the channel gets disabled. Otherwise (timeouts, connection errors, 408, 429, 5xx) retry."""

    def __init__(self, message: str, *, permanent: bool = False, status_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.permanent = permanent
        self.status_code = status_code


# 408 Request Timeout and 429 Too Many Requests are the 4xx answers that ask for a later try.
TRANSIENT_4XX = {408, 429}


def post(url: str, body: bytes, *, headers: dict[str, str], timeout_s: float) -> int:
    """POST `body`; returns the 2xx status code or raises TransportError."""
    try:
        response = requests.post(url, data=body, headers=headers, timeout=timeout_s, allow_redirects=False)
    except requests.Timeout:
        raise TransportError(f"no answer within {timeout_s:g}s") from None
    except requests.exceptions.InvalidURL as exc:
        raise TransportError(f"invalid URL: {exc}", permanent=True) from None
    except requests.exceptions.MissingSchema as exc:
        raise TransportError(f"invalid URL: {exc}", permanent=True) from None
    except requests.ConnectionError as exc:
        raise TransportError(f"connection failed: {exc.__class__.__name__}: {str(exc)[:300]}") from None
    except requests.RequestException as exc:
        raise TransportError(f"request failed: {exc.__class__.__name__}: {str(exc)[:300]}") from None
    code = response.status_code
    if 200 <= code < 300:
        return code
    snippet = response.text[:200].strip()
    message = f"HTTP {code}" + (f": {snippet}" if snippet else "")
    if 400 <= code < 500 and code not in TRANSIENT_4XX:
        raise TransportError(message, permanent=True, status_code=code)
    # 3xx (redirects are not followed: a webhook URL that moved must be updated), 408, 429 and 5xx.
    raise TransportError(message, permanent=300 <= code < 400, status_code=code)
