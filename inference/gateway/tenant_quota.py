"""A tenant's limits on one gateway (tenant_limits.py declares them): its token buckets, its requests in flight, and
the ticket each admitted request holds until it ends.

Limits are per tenant and per gateway: requests and tokens per minute are token buckets holding one minute's worth (a
tenant idle for a minute may spend that at once, no more); tokens are the prompt + completion tokens of finished
requests, reserved at admission and settled when they finish (a request is admitted while the bucket holds its
reservation, and its real usage may take the bucket below zero: the next ones wait until it refills). Concurrency
counts requests in flight. Over a limit: 429 with Retry-After and an OpenAI `rate_limit_error` whose `param` names the
limit.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from inference.gateway.fair_queue import ANONYMOUS, ANONYMOUS_CLASS
from inference.gateway.openai_protocol import ApiError
from inference.gateway.tenant_limits import BUCKET_LIMITS
from inference.gateway.tenant_metrics import Histogram
from inference.gateway.tenant_policy import TenantPolicy
from inference.metrics import TTFT_BUCKETS


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
    """One tenant on this gateway: its policy, buckets (one per per-minute limit it has, by the limit's `bucket`),
    requests in flight and counters (its /metrics series)."""

    def __init__(self, policy: TenantPolicy, now: float) -> None:
        self.policy = policy
        self.buckets: dict[str, TokenBucket] = {}
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
            bucket = self.buckets.get(kind)
            if bucket is not None:
                level = min(per_minute, level + max(0.0, since_s) * per_minute / 60.0)
                bucket.level = min(float(bucket.per_minute), level + bucket.per_minute - per_minute)
                bucket.updated = now

    def apply(self, policy: TenantPolicy, now: float) -> None:
        """Take a new policy: a bucket whose limit changed keeps what was spent (TokenBucket.resize); one whose limit
        went away goes, and starts full if the limit comes back."""
        self.policy = policy
        buckets = {}
        for limit in BUCKET_LIMITS:
            per_minute = policy.limits.get(limit.name)
            if per_minute is None:
                continue
            bucket = self.buckets.get(limit.bucket)
            if bucket is None:
                bucket = TokenBucket(per_minute, now)
            elif bucket.per_minute != per_minute:
                bucket.resize(per_minute, now)
            buckets[limit.bucket] = bucket
        self.buckets = buckets


# A prompt's tokens are not known before a worker tokenizes it: a reservation counts one per this many characters
# (a rough rate for English text under a BPE tokenizer), and the request's real usage settles it at the end.
CHARS_PER_TOKEN_ESTIMATE = 4


def reservation(worker_body: dict) -> int:
    """The tokens a request may take: its prompt's, estimated, and its max_tokens (null: the rest of the context,
    bounded by the tenant's minute where the caller reserves)."""
    prompt = worker_body.get("prompt")
    num_chars = len(prompt) if isinstance(prompt, str) else sum(
        len(m.get("content") or "") for m in worker_body.get("messages") or () if isinstance(m, dict))
    max_tokens = worker_body.get("max_tokens")
    return math.ceil(num_chars / CHARS_PER_TOKEN_ESTIMATE) + (max_tokens if max_tokens is not None else 1 << 30)


class Ticket:
    """One admitted request: releases its concurrency slot (and its admission slot, `slot`, once it has one) and
    counts its tokens (from the stream's real usage) when it ends. A request without a tenant gets a ticket that
    counts nothing."""

    __slots__ = ("state", "clock", "stream", "slot", "reserved", "anonymous", "_done")

    def __init__(self, state: TenantState | None, clock: Callable[[], float], reserved: int = 0,
                 anonymous: str = ANONYMOUS) -> None:
        self.state, self.clock, self.stream, self.slot, self._done = state, clock, None, None, False
        self.reserved = reserved  # tokens taken from its tenant's minute at admission; settled at the end
        self.anonymous = anonymous  # an anonymous caller's fairness key (tenancy.anonymous_key)

    @property
    def tenant(self) -> str:
        """Who admission counts it against: the tenant, or an anonymous caller's key (tenancy.anonymous_key)."""
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
        tokens = state.buckets.get("tokens")
        if tokens is not None:
            tokens.take(prompt + completion - self.reserved, self.clock())  # the real usage, less the reserve


def admit(state: TenantState, body: dict, worker_body: dict, clock: Callable[[], float]) -> Ticket:
    """A ticket for a tenant's request, or 400 (max_tokens above the tenant's cap) / 429 (over a limit). A tenant's
    max_tokens cap fills in for a request that asks for none or got a larger default; a request that asks for more
    itself is refused, naming the cap (retrying would not help, so not a 429). The metered limits are checked in
    the order max_concurrent_requests, requests_per_minute, tokens_per_minute, and nothing is taken from any bucket
    unless all of them admit the request."""
    limits, now = state.policy.limits, clock()
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
        raise _limited(state, "max_concurrent_requests", concurrency, 1.0)
    requests, tokens = state.buckets.get("requests"), state.buckets.get("tokens")
    if requests is not None:
        wait = requests.wait_s(1, now)
        if wait > 0:
            raise _limited(state, "requests_per_minute", requests.per_minute, wait)
    reserved = 0
    if tokens is not None:
        # What the request may take is reserved now (its prompt, estimated from its characters, and max_tokens),
        # and settled with its real usage when it ends: a burst of parallel requests cannot overrun the minute
        # by more than one reservation, as it could when tokens were only counted at the end.
        reserved = min(reservation(worker_body), tokens.per_minute)
        wait = tokens.wait_s(reserved, now)
        if wait > 0:
            raise _limited(state, "tokens_per_minute", tokens.per_minute, wait)
    if requests is not None:
        requests.take(1, now)
    if tokens is not None:
        tokens.take(reserved, now)
    state.num_running += 1
    state.num_requests += 1
    return Ticket(state, clock, reserved)


def _limited(state: TenantState, limit: str, value: int, wait_s: float) -> ApiError:
    state.num_limited[limit] = state.num_limited.get(limit, 0) + 1
    retry_after = max(1, math.ceil(wait_s))
    return ApiError(429, f"tenant {state.policy.name} is over its {limit} limit ({value}); retry after "
                         f"{retry_after} s", type="rate_limit_error", param=limit, code="rate_limit_exceeded",
                    headers={"Retry-After": str(retry_after)})
