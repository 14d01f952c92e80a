"""Tandem-Signature: HMAC-SHA256 over `<timestamp>.<body>`, as Stripe does.

    Tandem-Signature: t=1732945200,v1=5257a869...,v1=9f86d081...

One `v1` per signing secret: during a rotation the channel holds the new and the old secret and signs with both, so
a receiver that knows either accepts the message. The timestamp is inside the signed bytes, so a receiver that
rejects stale timestamps (tolerance) also rejects replays of an old message.

Receivers can copy `verify_signature` as it is: it needs only the standard library.
"""
from __future__ import annotations

import hashlib
import hmac
import time

HEADER = "Tandem-Signature"
DEFAULT_TOLERANCE_S = 300


def _digest(secret: str, timestamp: int, body: bytes) -> str:
    message = str(timestamp).encode() + b"." + body
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def sign(body: bytes, secrets: list[str], *, timestamp: int | None = None) -> str:
    """The header value for `body` signed with each secret (current first)."""
    if not secrets:
        raise ValueError("signing needs at least one secret")
    timestamp = int(time.time()) if timestamp is None else int(timestamp)
    return ",".join([f"t={timestamp}"] + [f"v1={_digest(s, timestamp, body)}" for s in secrets])


def verify_signature(header: str | None, body: bytes, secrets: list[str], tolerance_s: float = DEFAULT_TOLERANCE_S,
                     *, now: float | None = None) -> bool:
    """True when `header` carries a timestamp within `tolerance_s` of now and at least one v1 signature that one of
    `secrets` produced over exactly these body bytes (compared in constant time). False for anything else: no
    header, a malformed one, a stale or future timestamp, or no matching signature."""
    if not header or not secrets:
        return False
    timestamp, signatures = None, []
    for part in header.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep:
            return False
        if key == "t":
            try:
                timestamp = int(value)
            except ValueError:
                return False
        elif key == "v1":
            signatures.append(value)
    if timestamp is None or not signatures:
        return False
    now = time.time() if now is None else now
    if abs(now - timestamp) > tolerance_s:
        return False
    expected = [_digest(secret, timestamp, body) for secret in secrets]
    # Check every pair without stopping early: the time taken must not say which secret or signature matched.
    matched = False
    for candidate in signatures:
        for digest in expected:
            matched |= hmac.compare_digest(candidate, digest)
    return matched
