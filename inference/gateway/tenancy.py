"""Tenants at the gateway: who is asking (an API key, known by its SHA-256), whether they may ask this deployment,
and whether they are within their limits.

The control plane's endpoints answer carries the policy (docs/contracts.md, "Tenants"): whether the deployment
requires a key, and for every tenant with an active key its class, limits, whether it may use this deployment and
its keys' hashes and expiry. `parse_tenancy` checks it like the rest of the answer (a bad one keeps the last good
membership); `TenantGate` enforces the last good one, so a key revoked in the control plane stops working at the
next poll, and the gateway keeps enforcing what it knows while the control plane is away.

Limits (each optional) are per tenant and per gateway: requests and tokens per minute are token buckets holding one
minute's worth (a tenant idle for a minute may spend that at once, no more); tokens are the prompt + completion
tokens of finished requests, counted when they finish (a request is admitted while the bucket is not below zero, and
may take it below: the next ones wait until it refills). Concurrency counts requests in flight. Over a limit: 429 with
Retry-After and an OpenAI `rate_limit_error` whose `param` names the limit.
"""
from __future__ import annotations

import hashlib
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client.registry import Collector

from inference.gateway.fair_queue import ANONYMOUS, ANONYMOUS_BUCKETS, ANONYMOUS_CLASS, BANDS
from inference.gateway.openai_protocol import ApiError
from inference.gateway.tenant_metrics import Histogram, TenantCollector
from inference.metrics import TTFT_BUCKETS

PRIORITY_CLASSES = BANDS  # the admission queue dispatches them in this order
LIMITS = ("requests_per_minute", "tokens_per_minute", "max_concurrent_requests", "max_tokens")
# A tenant's name is a label value and a log word: the control plane's name rule (a DNS label).
TENANT_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
HASH_RE = re.compile(r"[0-9a-f]{64}")


class TenancyError(ValueError):
    """The answer's tenant part is malformed (the membership keeps its last good answer)."""


@dataclass(frozen=True, slots=True)
class TenantPolicy:
    name: str
    priority_class: str
    limits: Mapping[str, int]
    allowed: bool  # may use this deployment: a key of a tenant that may not gets 404 model_not_found


@dataclass(frozen=True, slots=True)
class Tenancy:
    requires_key: bool = False
    tenants: Mapping[str, TenantPolicy] = field(default_factory=dict)
    # sha256 hex of a key → (its tenant, when it expires in Unix seconds or None)
    keys: Mapping[str, tuple[str, float | None]] = field(default_factory=dict)


OPEN = Tenancy()


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_tenancy(body: dict) -> Tenancy:
    """`requires_key` (absent or null: false) and `tenants` (absent or null: none) of an endpoints answer."""
    requires_key = body.get("requires_key")
    if requires_key is None:
        requires_key = False
    if not isinstance(requires_key, bool):
        raise TenancyError(f"'requires_key' must be true or false, not {requires_key!r}")
    tenants_in = body.get("tenants") or {}
    if not isinstance(tenants_in, dict):
        raise TenancyError("'tenants' is not an object of tenant name → tenant")
    tenants, keys = {}, {}
    for name, entry in tenants_in.items():
        if not TENANT_RE.fullmatch(name):
            raise TenancyError(f"tenant name {name[:80]!r} is not 1-63 lowercase letters, digits and dashes")
        if not isinstance(entry, dict):
            raise TenancyError(f"tenant {name} is not an object")
        priority_class = entry.get("class")
        if priority_class not in PRIORITY_CLASSES:
            raise TenancyError(f"the class of tenant {name} must be one of {', '.join(PRIORITY_CLASSES)}, "
                               f"not {priority_class!r}")
        limits = entry.get("limits") or {}
        if not isinstance(limits, dict):
            raise TenancyError(f"the limits of tenant {name} are not an object")
        # A limit this gateway does not know (a newer control plane's) is left to gateways that do.
        known = {limit: limits[limit] for limit in LIMITS if limits.get(limit) is not None}
        for limit, value in known.items():
            if not _is_int(value) or value < 1:
                raise TenancyError(f"{limit} of tenant {name} must be a whole number >= 1, not {value!r}")
        allowed = entry.get("allowed")
        if not isinstance(allowed, bool):
            raise TenancyError(f"'allowed' of tenant {name} must be true or false, not {allowed!r}")
        key_list = entry.get("keys") or []
        if not isinstance(key_list, list):
            raise TenancyError(f"the keys of tenant {name} are not a list")
        for key in key_list:
            if not isinstance(key, dict) or not isinstance(key.get("hash"), str) or not HASH_RE.fullmatch(key["hash"]):
                raise TenancyError(f"a key of tenant {name} has no 'hash' of 64 lowercase hex digits (sha256)")
            expires_at = key.get("expires_at")
            if expires_at is not None and (isinstance(expires_at, bool) or not isinstance(expires_at, (int, float))
                                           or not math.isfinite(expires_at)):
                raise TenancyError(f"'expires_at' of a key of tenant {name} must be Unix seconds or null, "
                                   f"not {expires_at!r}")
            if key["hash"] in keys:
                raise TenancyError(f"a key hash is listed twice (tenants {keys[key['hash']][0]} and {name})")
            keys[key["hash"]] = (name, None if expires_at is None else float(expires_at))
        tenants[name] = TenantPolicy(name, priority_class, MappingProxyType(known), allowed)
    return Tenancy(requires_key, MappingProxyType(tenants), MappingProxyType(keys))


class TokenBucket:
    """`per_minute` tokens a minute, holding at most a minute's worth. `take` may leave it below zero (a finished
    request's tokens are counted after the fact); `wait_s` says how long until it holds `amount` again."""

    __slots__ = ("per_minute", "level", "updated")

    def __init__(self, per_minute: int, now: float) -> None:
        self.per_minute = per_minute
        self.level = float(per_minute)
        self.updated = now

    def _refill(self, now: float) -> None:
        self.level = min(float(self.per_minute), self.level + (now - self.updated) * self.per_minute / 60.0)
        self.updated = now

    def wait_s(self, amount: float, now: float) -> float:
        self._refill(now)
        return max(0.0, (amount - self.level) * 60.0 / self.per_minute)

    def take(self, amount: float, now: float) -> None:
        self._refill(now)
        self.level -= amount

    def resize(self, per_minute: int, now: float) -> None:
        """A changed limit keeps what was spent of the minute: 3 of 10 spent, then a limit of 4, leaves 1."""
        self._refill(now)
        self.level = min(float(per_minute), self.level + per_minute - self.per_minute)
        self.per_minute = per_minute


class TenantState:
    """One tenant on this gateway: its policy, buckets, requests in flight and counters (its /metrics series)."""

    def __init__(self, policy: TenantPolicy, now: float) -> None:
        self.policy = policy
        self.requests: TokenBucket | None = None
        self.tokens: TokenBucket | None = None
        self.num_running = 0
        self.num_requests = 0
        self.num_prompt_tokens = 0
        self.num_completion_tokens = 0
        self.num_errors = 0
        self.num_limited: dict[str, int] = {}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.apply(policy, now)

    def carry(self, carried: dict[str, list[float]], now: float, since_s: float) -> None:
        """Start from a previous process's levels ({bucket: [per_minute, level]}, as of `since_s` ago), refilled
        since, under the current limits: what was spent of the minute stays spent."""
        for kind, (per_minute, level) in carried.items():
            bucket = getattr(self, kind, None)
            if isinstance(bucket, TokenBucket):
                level = min(per_minute, level + max(0.0, since_s) * per_minute / 60.0)
                bucket.level = min(float(bucket.per_minute), level + bucket.per_minute - per_minute)
                bucket.updated = now

    def apply(self, policy: TenantPolicy, now: float) -> None:
        self.policy = policy
        self.requests = _bucket(self.requests, policy.limits.get("requests_per_minute"), now)
        self.tokens = _bucket(self.tokens, policy.limits.get("tokens_per_minute"), now)


def _bucket(bucket: TokenBucket | None, per_minute: int | None, now: float) -> TokenBucket | None:
    if per_minute is None:
        return None
    if bucket is None:
        return TokenBucket(per_minute, now)
    if bucket.per_minute != per_minute:
        bucket.resize(per_minute, now)
    return bucket


# A prompt's tokens are not known before a worker tokenizes it: a reservation counts one per this many characters
# (English text under a BPE tokenizer runs about 4), and the request's real usage settles it at the end.
CHARS_PER_TOKEN_ESTIMATE = 4


def reservation(worker_body: dict) -> int:
    """The tokens a request may take: its prompt's, estimated, and its max_tokens (null: the rest of the context,
    bounded by the tenant's minute where the caller reserves)."""
    prompt = worker_body.get("prompt")
    num_chars = len(prompt) if isinstance(prompt, str) else sum(
        len(m.get("content") or "") for m in worker_body.get("messages") or () if isinstance(m, dict))
    max_tokens = worker_body.get("max_tokens")
    return math.ceil(num_chars / CHARS_PER_TOKEN_ESTIMATE) + (max_tokens if max_tokens is not None else 1 << 30)


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


class Ticket:
    """One admitted request: releases its concurrency slot (and its admission slot, `slot`, once it has one) and
    counts its tokens (from the stream's real usage) when it ends. A request without a tenant gets a ticket that
    counts nothing."""

    __slots__ = ("state", "clock", "stream", "slot", "reserved", "anonymous", "_done")

    def __init__(self, state: TenantState | None, clock: Callable[[], float], reserved: int = 0,
                 anonymous: str = ANONYMOUS) -> None:
        self.state, self.clock, self.stream, self.slot, self._done = state, clock, None, None, False
        self.reserved = reserved  # tokens taken from its tenant's minute at admission; settled at the end
        self.anonymous = anonymous  # an anonymous caller's fairness key (anonymous_key)

    @property
    def tenant(self) -> str:
        """Who admission counts it against: the tenant, or an anonymous caller's key (anonymous_key)."""
        return self.state.policy.name if self.state is not None else self.anonymous

    @property
    def priority_class(self) -> str:
        return self.state.policy.priority_class if self.state is not None else ANONYMOUS_CLASS

    def observe_ttft(self, seconds: float) -> None:
        """The request's time to first token, into its tenant's histogram (none for an anonymous caller)."""
        if self.state is not None:
            self.state.ttft.observe(seconds)

    def release(self) -> None:
        if self._done:
            return
        self._done = True
        if self.slot is not None:
            self.slot.release()
        if self.state is None:
            return
        state, stream = self.state, self.stream
        state.num_running -= 1
        finish = stream.finish if stream is not None else None
        prompt = stream.prompt_tokens if stream is not None else 0
        completion = finish.completion_tokens if finish is not None else len(stream.token_ids) if stream else 0
        state.num_prompt_tokens += prompt
        state.num_completion_tokens += completion
        if finish is None:
            state.num_errors += 1
        if state.tokens is not None:
            state.tokens.take(prompt + completion - self.reserved, self.clock())  # the real usage, less the reserve


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
        """A ticket for the request, or 400 (max_tokens above the tenant's cap) / 429 (over a limit). A tenant's
        max_tokens cap fills in for a request that asks for none or got a larger default; a request that asks for
        more itself is refused, naming the cap (retrying would not help, so not a 429). `caller` tells anonymous
        callers apart for fairness (anonymous_key)."""
        if state is None:
            return Ticket(None, self.clock, anonymous=anonymous_key(caller))
        limits, now = state.policy.limits, self.clock()
        cap = limits.get("max_tokens")
        if cap is not None and (worker_body.get("max_tokens") is None or worker_body["max_tokens"] > cap):
            asked = next((body[name] for name in ("max_completion_tokens", "max_tokens")
                          if body.get(name) is not None), None)
            if asked is not None:
                param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
                raise ApiError(400, f"{param} {asked} is above tenant {state.policy.name}'s max_tokens limit "
                                    f"({cap})", param=param, code="max_tokens_exceeded")
            worker_body["max_tokens"] = cap
        concurrency = limits.get("max_concurrent_requests")
        if concurrency is not None and state.num_running >= concurrency:
            raise self._limited(state, "max_concurrent_requests", concurrency, 1.0)
        if state.requests is not None:
            wait = state.requests.wait_s(1, now)
            if wait > 0:
                raise self._limited(state, "requests_per_minute", state.requests.per_minute, wait)
        reserved = 0
        if state.tokens is not None:
            # What the request may take is reserved now (its prompt, estimated from its characters, and max_tokens),
            # and settled with its real usage when it ends: a burst of parallel requests cannot overrun the minute
            # by more than one reservation, as it could when tokens were only counted at the end.
            reserved = min(reservation(worker_body), state.tokens.per_minute)
            wait = state.tokens.wait_s(reserved, now)
            if wait > 0:
                raise self._limited(state, "tokens_per_minute", state.tokens.per_minute, wait)
        if state.requests is not None:
            state.requests.take(1, now)
        if state.tokens is not None:
            state.tokens.take(reserved, now)
        state.num_running += 1
        state.num_requests += 1
        # The workers key this tenant's prefix-cache blocks with it: another tenant's prompt cannot find them, so
        # its time to first token says nothing of what this tenant sent (the shared prompt's blocks excepted).
        worker_body["cache_salt"] = state.policy.name
        # The workers admit their waiting requests by the same bands as the admission queue (scheduler.py), so a
        # quiet interactive request does not queue there behind a noisy tenant's batch streams.
        worker_body["priority"] = state.policy.priority_class
        return Ticket(state, self.clock, reserved)

    @staticmethod
    def _limited(state: TenantState, limit: str, value: int, wait_s: float) -> ApiError:
        state.num_limited[limit] = state.num_limited.get(limit, 0) + 1
        retry_after = max(1, math.ceil(wait_s))
        return ApiError(429, f"tenant {state.policy.name} is over its {limit} limit ({value}); retry after "
                             f"{retry_after} s", type="rate_limit_error", param=limit, code="rate_limit_exceeded",
                        headers={"Retry-After": str(retry_after)})

    def collector(self, model: str) -> Collector:
        return TenantCollector(self, model)
