"""Tenants at the gateway: who is asking (an API key, known by its SHA-256), whether they may ask this deployment,
and whether they are within their limits.

The gate enforces the last good Tenancy (tenant_policy.py) the membership parsed from the control plane's answer, so
a key revoked in the control plane stops working at the next poll, and the gateway keeps enforcing what it knows while
the control plane is away. It identifies the caller here and leaves the limits to tenant_quota.py.
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Callable

from prometheus_client.registry import Collector

from inference.gateway.fair_queue import ANONYMOUS, ANONYMOUS_BUCKETS
from inference.gateway.openai_protocol import ApiError
from inference.gateway.tenant_metrics import TenantCollector
from inference.gateway.tenant_policy import OPEN, Tenancy
from inference.gateway.tenant_quota import TenantState, Ticket, admit


def anonymous_key(caller: str) -> str:
    """An anonymous caller's fairness key: its OpenAI `user` field where it sends one, else its connection's address
    (never X-Forwarded-For, which any client can write), hashed into one of ANONYMOUS_BUCKETS. Fairness, not
    authentication: a caller that spreads over addresses gets more turns, as it would by opening more connections."""
    digest = hashlib.sha256(caller.encode("utf-8", "surrogateescape")).digest()
    return f"{ANONYMOUS}:{int.from_bytes(digest[:4], 'big') % ANONYMOUS_BUCKETS}"


def _bearer(authorization: str | None) -> str | None:
    """The key of `Authorization: Bearer <key>` (what the OpenAI client sends with api_key=), else None."""
    if not authorization:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    key = key.strip()
    return key if scheme.lower() == "bearer" and key else None


def _unauthorized(message: str, code: str) -> ApiError:
    return ApiError(401, message, code=code, headers={"WWW-Authenticate": 'Bearer realm="tandem"'})


class TenantGate:
    """Enforces the last good Tenancy that `source()` returns (the membership's): identify the caller, then admit
    its request or refuse it."""

    def __init__(self, source: Callable[[], Tenancy], *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.source, self.clock, self.wall = source, clock, wall
        self.policy = OPEN
        self.states: dict[str, TenantState] = {}
        # Bucket levels a previous process of this gateway saved (quota_state.py), by tenant, as of wall time
        # `carried_at`: each tenant takes its own when the membership names it again.
        self.carried: dict[str, dict[str, list[float]]] = {}
        self.carried_at = 0.0

    def sync(self) -> Tenancy:
        policy = self.source()
        if policy is not self.policy:
            now = self.clock()
            states = {}
            for name, tenant in policy.tenants.items():
                state = self.states.get(name)
                if state is None:
                    state = TenantState(tenant, now)
                    carried = self.carried.pop(name, None)
                    if carried is not None:
                        state.carry(carried, now, self.wall() - self.carried_at)
                else:
                    state.apply(tenant, now)
                states[name] = state
            # A tenant gone from the answer leaves (its series too: the label stays bounded by the membership).
            self.policy, self.states = policy, states
        return self.policy

    def identify(self, authorization: str | None, model: str) -> TenantState | None:
        """The caller's tenant, or None for an anonymous caller of an open deployment.
        1. No key, or one this gateway does not know: 401 when the deployment requires a key, else anonymous.
        2. An expired key: 401 likewise (the control plane drops it at its next answer; this covers the time
           between, and a control plane that is away).
        3. A key of a tenant that may not use this deployment: 404 model_not_found (anonymous when open)."""
        policy = self.sync()
        key = _bearer(authorization)
        # surrogateescape: a header byte that is not UTF-8 arrives as a lone surrogate; hashed as the bytes it was,
        # it is an unknown key (401), never an encoding error (500).
        known = (policy.keys.get(hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest())
                 if key is not None else None)
        if known is None:
            if not policy.requires_key:
                return None
            if key is None:
                raise _unauthorized("You didn't provide an API key: send it as 'Authorization: Bearer <key>' (the "
                                    "OpenAI client's api_key).", "missing_api_key")
            raise _unauthorized(f"Incorrect API key provided: {ascii(key[:6])[1:-1]}…; it is unknown or revoked.",
                                "invalid_api_key")
        name, expires_at = known
        if expires_at is not None and expires_at <= self.wall():
            if not policy.requires_key:
                return None
            raise _unauthorized(f"The API key {key[:6]}… has expired.", "invalid_api_key")
        state = self.states[name]
        if not state.policy.allowed:
            if not policy.requires_key:
                return None
            raise ApiError(404, f"The model '{model}' does not exist or you do not have access to it.",
                           param="model", code="model_not_found")
        return state

    def admit(self, state: TenantState | None, body: dict, worker_body: dict, *, caller: str = "") -> Ticket:
        """A ticket for the request, or 400 / 429 where it is over one of its tenant's limits (tenant_quota.admit).
        `caller` tells anonymous callers apart for fairness (anonymous_key)."""
        if state is None:
            return Ticket(None, self.clock, anonymous=anonymous_key(caller))
        ticket = admit(state, body, worker_body, self.clock)
        # The workers key this tenant's prefix-cache blocks with it: another tenant's prompt cannot find them, so
        # its time to first token says nothing of what this tenant sent (the shared prompt's blocks excepted).
        worker_body["cache_salt"] = state.policy.name
        # The workers admit their waiting requests by the same bands as the admission queue (scheduler.py), so a
        # quiet interactive request does not queue there behind a noisy tenant's batch streams.
        worker_body["priority"] = state.policy.priority_class
        return ticket

    def collector(self, model: str) -> Collector:
        return TenantCollector(self, model)
