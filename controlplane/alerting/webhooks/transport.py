"""Outgoing HTTP: one POST with a timeout, and errors that say whether trying again can help.

A destination on a loopback, link-local, private or otherwise non-public address is refused (checked when a
channel is saved and again before each POST, since a name can be made to resolve elsewhere later) unless
TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS is on: an admin's channel URL must not turn the control plane into a client
of its own network's services.
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

import requests
from django.conf import settings


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


def _not_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def destination_refused(url: str, *, resolve: bool = True) -> str | None:
    """Why `url` may not be called (a sentence), or None. A name that does not resolve is not refused here: the
    POST will fail on its own, and be checked again then."""
    if settings.TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS:
        return None
    host = urlsplit(url).hostname or ""
    try:
        addresses = [host] if _is_ip(host) else (
            [info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)] if resolve else [])
    except (OSError, UnicodeError):
        return None
    for address in addresses:
        if _not_public(address):
            what = f"{host} is" if address == host else f"{host} resolves to {address},"
            return (f"{what} a loopback, link-local or private address: refused unless "
                    "TANDEM_WEBHOOK_ALLOW_PRIVATE_NETWORKS=1")
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    return True


def post(url: str, body: bytes, *, headers: dict[str, str], timeout_s: float) -> int:
    """POST `body`; returns the 2xx status code or raises TransportError."""
    refused = destination_refused(url)
    if refused is not None:
        raise TransportError(f"destination refused: {refused}", permanent=True)
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
