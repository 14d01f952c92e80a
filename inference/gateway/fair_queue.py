"""The admission queue's order, pure (no asyncio, no clock: tested one decision at a time). When a slot frees, the next
request goes:

1. the first band with a request waiting, in the order interactive, standard, batch (strict priority);
2. within the band, the backlogged tenant with the smallest virtual token counter (VTC, Sheng et al., "Fairness in
   Serving Large Language Models", OSDI 2024): each tenant's counter grows by the prompt tokens and
   COMPLETION_WEIGHT × the completion tokens it is served, charged as they stream. A tenant that becomes backlogged
   is lifted to the smallest counter among the backlogged tenants of its band (to the last admitted tenant's when
   none is), and so is one that starts to run without waiting after holding nothing, so time spent idle earns no
   credit to spend later in a burst. A tie (which the lift makes) goes to
   the tenant holding fewer slots, whose counter grows slower from now on: else a quiet tenant lifted beside a
   flood waits behind it, and so does preemption, until the flood's next tokens are charged;
3. within the tenant, its oldest request; but in an overloaded band, its newest: a band is overloaded while one of
   its requests has waited OVERLOAD_SHARE of its class's deadline. There more arrives than the fleet serves, and in
   arrival order every request would wait about the deadline and most would miss it (the TTFT of those served is the
   deadline: goodput collapses). Newest first (adaptive LIFO, as Facebook's queues do, "Fail at Scale", 2015), those
   served are served soon, and the oldest, which would be late anyway, reach the deadline and are shed. A preempted
   request going back (at the front of its tenant's queue) still goes first.

Requests of an open deployment (no key) are told apart for fairness, by their `user` field or their connection's
address, into ANONYMOUS_BUCKETS keys `_anonymous:N` (tenancy.anonymous_key) of class standard: one anonymous flood is
one tenant among them, not every keyless caller's. Their series count them as one, ANONYMOUS (`label_of`).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

BANDS = ("interactive", "standard", "batch")  # dispatch order
ANONYMOUS = "_anonymous"  # not a valid tenant name (tenant_policy.TENANT_RE), so it cannot collide with one
ANONYMOUS_CLASS = "standard"
# Fairness keys of anonymous callers (`_anonymous:0` .. `_anonymous:63`): a bounded number of queues and counters,
# whatever the number of addresses; two callers that share a key share its turn.
ANONYMOUS_BUCKETS = 64
COMPLETION_WEIGHT = 2.0  # VTC's w_q / w_p: a generated token costs about twice a prompt token to serve
# A band whose oldest waiting request has waited this share of its deadline dispatches newest first (docstring, 3.).
OVERLOAD_SHARE = 0.5


def label_of(tenant: str) -> str:
    """The `tenant` label a fairness key counts under in the series: anonymous callers' keys as one."""
    return ANONYMOUS if tenant.startswith(ANONYMOUS + ":") else tenant


@dataclass(eq=False, slots=True)
class Waiter:
    tenant: str
    priority_class: str
    enqueued: float
    deadline: float
    future: object | None = None  # Admission's asyncio.Future for the waiting request; the queue never reads it
    requeued: bool = False  # a preempted request going back (preemption.py): its wait is no admission wait


class FairQueue:
    """Waiting requests by band and tenant, and every tenant's virtual token counter."""

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        self.holding: dict[str, int] = {}  # tenant → slots its requests hold (Admission keeps it), for ties
        self.bands: dict[str, dict[str, deque[Waiter]]] = {band: {} for band in BANDS}
        self.last_counter: dict[str, float] = {band: 0.0 for band in BANDS}
        self._band_of: dict[str, str] = {}  # tenant → the band of its last admitted request (hold: its departure)
        self.num_queued = 0

    def push(self, waiter: Waiter, *, front: bool = False) -> None:
        """Queue a request behind its tenant's others, or ahead of them (`front`: a preempted one going back)."""
        band = self.bands[waiter.priority_class]
        queue = band.get(waiter.tenant)
        if queue is None:
            # The tenant becomes backlogged: lift it so that idle time earns no credit.
            floor = min((self.counters[t] for t in band), default=self.last_counter[waiter.priority_class])
            self.counters[waiter.tenant] = max(self.counters.get(waiter.tenant, 0.0), floor)
            queue = band[waiter.tenant] = deque()
        if front:
            queue.appendleft(waiter)
        else:
            queue.append(waiter)
        self.num_queued += 1

    def peek(self) -> tuple[str, str] | None:
        """(class, tenant) of the request `pop` would return, or None when none waits."""
        for priority_class, band in self.bands.items():
            if band:
                return priority_class, self._next_tenant(band)
        return None

    def _next_tenant(self, band: dict[str, deque[Waiter]]) -> str:
        return min(band, key=lambda t: (self.counters[t], self.holding.get(t, 0)))

    def overloaded(self, priority_class: str, now: float) -> bool:
        """Whether one of the band's requests (not a preempted one going back) has waited OVERLOAD_SHARE of its
        deadline by `now`."""
        for queue in self.bands[priority_class].values():
            for waiter in queue:  # the oldest first, after any preempted ones at the front
                if not waiter.requeued:
                    if now - waiter.enqueued >= OVERLOAD_SHARE * (waiter.deadline - waiter.enqueued):
                        return True
                    break
        return False

    def pop(self, now: float | None = None) -> Waiter | None:
        """The next request to dispatch (module docstring), or None when none waits. Without `now`, each tenant's
        oldest (no band is judged overloaded)."""
        for priority_class, band in self.bands.items():
            if not band:
                continue
            tenant = self._next_tenant(band)
            queue = band[tenant]
            newest = now is not None and not queue[0].requeued and self.overloaded(priority_class, now)
            waiter = queue.pop() if newest else queue.popleft()
            if not queue:
                del band[tenant]
            self.last_counter[priority_class] = self.counters[tenant]
            self.num_queued -= 1
            return waiter
        return None

    def remove(self, waiter: Waiter) -> bool:
        """Take out a request that stopped waiting (its deadline passed, its client left); False if not queued."""
        band = self.bands[waiter.priority_class]
        queue = band.get(waiter.tenant)
        if queue is None or waiter not in queue:
            return False
        queue.remove(waiter)
        if not queue:
            del band[waiter.tenant]
        self.num_queued -= 1
        return True

    def admitted(self, tenant: str, priority_class: str) -> None:
        """A request of `tenant` starts to run, whether it waited or not (before its slot is held). A tenant that held
        no slot and waited for none becomes active here: lifted to the band's last counter, as `push` lifts one that
        becomes backlogged; then its counter is the band's last (and again when it leaves, `hold`, with the tokens
        it was served since). Without it a tenant served alone, never
        queued, kept a counter far above that of a tenant idle meanwhile, which then flooded in at its old counter
        and went first until it had caught up (a quiet tenant waited seconds at a flood's start; bench/gateway/
        tenants.py traced it: docs/performance.md, 'Tenants: admission queue and fair queuing')."""
        if not self.holding.get(tenant) and tenant not in self.bands[priority_class]:
            self.counters[tenant] = max(self.counters.get(tenant, 0.0), self.last_counter[priority_class])
        self.last_counter[priority_class] = self.counters.get(tenant, 0.0)
        self._band_of[tenant] = priority_class

    def charge(self, tenant: str, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        self.counters[tenant] = (self.counters.get(tenant, 0.0) + prompt_tokens
                                 + COMPLETION_WEIGHT * completion_tokens)

    def hold(self, tenant: str, num: int) -> None:
        """`num` more (or, below 0, fewer) slots held by `tenant`'s requests."""
        held = self.holding.get(tenant, 0) + num
        if held:
            self.holding[tenant] = held
            return
        del self.holding[tenant]
        band = self._band_of.get(tenant)
        if band is not None and tenant not in self.bands[band]:  # it leaves: the next to come is lifted to it
            self.last_counter[band] = self.counters.get(tenant, 0.0)

    def queued(self) -> dict[tuple[str, str], int]:
        """(class, tenant) → requests waiting."""
        return {(c, t): len(q) for c, band in self.bands.items() for t, q in band.items()}
