"""Admission: a bounded queue per deployment in front of the workers, dispatched by priority band and, within a band,
fairly across tenants by the tokens they were served.

The gateway lets at most `capacity()` requests run at once (routing.Router.capacity: for each ready worker that holds
streams, colocated or decode, the max_num_seqs its /health reports + `--worker-capacity-headroom`, at most
`--max-outstanding-per-worker`). A request that finds them all taken waits here instead of getting a 429
straight away, up to its class's deadline (`--queue-deadline`); when a slot frees, the next request goes:

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

Shed: 429 `queue_full` when `--admission-queue` requests already wait (0: admission steps aside and a full fleet
answers the router's straight 429 `overloaded`, as before there was a queue), 503
`queue_timeout` when a request's deadline passes while it waits; both with Retry-After. Requests of an open
deployment (no key) count as one tenant, ANONYMOUS, of class standard.

`FairQueue` is the pure part (no asyncio, no clock: tested one decision at a time); `Admission` wraps it with
futures, deadlines and the series on /metrics.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from inference.gateway.openai_protocol import ApiError

BANDS = ("interactive", "standard", "batch")  # dispatch order
ANONYMOUS = "_anonymous"  # not a valid tenant name (tenancy.TENANT_RE), so it cannot collide with one
ANONYMOUS_CLASS = "standard"
COMPLETION_WEIGHT = 2.0  # VTC's w_q / w_p: a generated token costs about twice a prompt token to serve
DEFAULT_MAX_QUEUED = 1024
# Slots per streaming worker beyond its max_num_seqs (--worker-capacity-headroom): a request or two waiting at the
# worker keep its batch full between one request's end and the next one's dispatch (docs/performance.md, tenants).
DEFAULT_HEADROOM = 2
DEFAULT_DEADLINES = {"interactive": 10.0, "standard": 30.0, "batch": 120.0}
# A band whose oldest waiting request has waited this share of its deadline dispatches newest first (docstring, 3.).
OVERLOAD_SHARE = 0.5
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
SHED_REASONS = ("queue_full", "queue_timeout")
RETRY_AFTER = "1"


@dataclass(eq=False, slots=True)
class Waiter:
    tenant: str
    priority_class: str
    enqueued: float
    deadline: float
    future: asyncio.Future | None = None
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
        and went first until it had caught up (a SmolLM2 worker: a quiet tenant waited 1.8-2.3 s at a flood's
        start, bench/gateway/tenants.py traced)."""
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


class Slot:
    """One admitted request's place among the `capacity()` running: charges its tenant's counter as tokens are
    served, and frees the place (dispatching the next waiter) once, when released."""

    __slots__ = ("admission", "tenant", "_done", "handoff")

    def __init__(self, admission: Admission, tenant: str, handoff: asyncio.Event | None = None) -> None:
        self.admission, self.tenant, self._done = admission, tenant, False
        self.handoff = handoff  # a preempted request's (Admission.hand_over): set once this one reached its worker

    def handed_over(self) -> None:
        """The request holding this slot reached its worker (or will not: released): a request preempted for it
        closes its own leg now (Admission.hand_over)."""
        if self.handoff is not None:
            self.handoff.set()

    def charge(self, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        self.admission.queue.charge(self.tenant, prompt_tokens, completion_tokens)

    def release(self) -> None:
        if self._done:
            return
        self._done = True
        self.handed_over()
        self.admission.num_running -= 1
        self.admission.queue.hold(self.tenant, -1)
        self.admission.dispatch()


class WaitStats:
    """One (class, tenant)'s queue waits (a histogram) and shed requests, for /metrics."""

    __slots__ = ("buckets", "total", "count", "shed")

    def __init__(self) -> None:
        self.buckets = [0] * len(WAIT_BUCKETS)
        self.total = 0.0
        self.count = 0
        self.shed = dict.fromkeys(SHED_REASONS, 0)

    def observe(self, seconds: float) -> None:
        self.total += seconds
        self.count += 1
        for i, bound in enumerate(WAIT_BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1


class Admission:
    def __init__(self, capacity: Callable[[], int], *, max_queued: int = DEFAULT_MAX_QUEUED,
                 deadlines: Mapping[str, float] = DEFAULT_DEADLINES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.capacity, self.max_queued, self.deadlines, self.clock = capacity, max_queued, dict(deadlines), clock
        self.queue = FairQueue()
        self.num_running = 0
        self._handoff: asyncio.Event | None = None  # for the next slot dispatched (hand_over)
        self.stats: dict[tuple[str, str], WaitStats] = {}
        # Called when a request starts to wait and on each dispatch tick (preemption.Preemption.consider).
        self.on_waiting: Callable[[], None] = lambda: None

    def configure(self, max_queued: int, deadlines: Mapping[str, float]) -> None:
        """New settings (a deployment's, from the membership poll): for requests that arrive from now on; those
        already waiting keep the deadline they came with."""
        self.max_queued, self.deadlines = max_queued, dict(deadlines)

    def _stats(self, priority_class: str, tenant: str) -> WaitStats:
        stats = self.stats.get((priority_class, tenant))
        if stats is None:
            stats = self.stats[(priority_class, tenant)] = WaitStats()
        return stats

    def has_room(self) -> bool:
        return self.num_running < self.capacity()

    def _admit(self, tenant: str, priority_class: str, waited_s: float) -> Slot:
        self._stats(priority_class, tenant).observe(waited_s)
        self.queue.admitted(tenant, priority_class)
        return self._slot(tenant)

    def _slot(self, tenant: str) -> Slot:
        self.num_running += 1
        self.queue.hold(tenant, 1)
        handoff, self._handoff = self._handoff, None
        return Slot(self, tenant, handoff)

    def hand_over(self, slot: Slot) -> asyncio.Event:
        """Release a preempted request's `slot` to the next waiter; the event is set once that waiter's request has
        reached its worker (Slot.handed_over), or at once when no waiter took the slot. The preempted request closes
        its leg, which frees its sequence on the worker, only then: a worker that frees the sequence before the
        waiter's request is there gives it to a request already waiting there (the flood's), and the waiter waits
        for the next stream to end (on a SmolLM2 worker beside 8 streams: 0.4-0.8 s, against ~50 ms)."""
        handoff = self._handoff = asyncio.Event()
        try:
            slot.release()
        finally:
            taken, self._handoff = self._handoff is None, None
        if not taken:
            handoff.set()
        return handoff

    async def acquire(self, tenant: str, priority_class: str, *, requeued: bool = False) -> Slot:
        """A slot to run the request in, at once or after a wait; ApiError 429 (queue full) or 503 (deadline).
        `requeued`: a preempted request (preemption.py) going back, at the front of its tenant's queue, never shed
        (its client already has an open answer) and not counted again among the queue waits."""
        if requeued:
            return await self._requeue(tenant, priority_class)
        # No queue, or no capacity known (no ready worker): admit, and let the router answer as it does (429
        # overloaded, 503 no_ready_workers).
        if not self.max_queued or self.capacity() <= 0 or (not self.queue.num_queued and self.has_room()):
            return self._admit(tenant, priority_class, 0.0)
        stats = self._stats(priority_class, tenant)
        if self.queue.num_queued >= self.max_queued:
            stats.shed["queue_full"] += 1
            raise ApiError(429, f"the gateway is at capacity: its admission queue is full ({self.max_queued} "
                                "requests waiting); retry later", type="rate_limit_error",
                           code="queue_full", headers={"Retry-After": RETRY_AFTER})
        now = self.clock()
        deadline_s = self.deadlines[priority_class]
        waiter = Waiter(tenant, priority_class, now, now + deadline_s, asyncio.get_running_loop().create_future())
        self.queue.push(waiter)
        self.dispatch()  # capacity may have grown since the last dispatch (a worker came back)
        if not waiter.future.done():
            self.on_waiting()
        try:
            done, _ = await asyncio.wait((waiter.future,), timeout=deadline_s)
        except asyncio.CancelledError:  # the client went away while it waited
            if not self.queue.remove(waiter) and waiter.future.done() and not waiter.future.cancelled():
                waiter.future.result().release()
            raise
        if not done:
            self.queue.remove(waiter)
            stats.shed["queue_timeout"] += 1
            raise ApiError(503, f"the request waited {deadline_s:g} s in the gateway's admission queue, the "
                                f"deadline of class {priority_class}; the fleet is saturated, retry later",
                           type="service_unavailable", code="queue_timeout", headers={"Retry-After": RETRY_AFTER})
        return waiter.future.result()

    async def _requeue(self, tenant: str, priority_class: str) -> Slot:
        now = self.clock()
        waiter = Waiter(tenant, priority_class, now, math.inf, asyncio.get_running_loop().create_future(),
                        requeued=True)
        self.queue.push(waiter, front=True)
        self.dispatch()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if not self.queue.remove(waiter) and waiter.future.done() and not waiter.future.cancelled():
                waiter.future.result().release()
            raise

    def dispatch(self) -> None:
        """Hand free slots to waiters, in FairQueue order. Called when a slot frees and when capacity may have
        grown (a worker came back)."""
        while self.queue.num_queued and self.has_room():
            waiter = self.queue.pop(self.clock())
            if waiter.future.done():  # cancelled between its wake-up and its removal
                continue
            if waiter.requeued:
                waiter.future.set_result(self._slot(waiter.tenant))
                continue
            waiter.future.set_result(self._admit(waiter.tenant, waiter.priority_class,
                                                 self.clock() - waiter.enqueued))

    async def run(self, interval: float = 0.05) -> None:
        """Dispatch now and then: capacity grows without a slot being freed when a worker becomes ready; and a
        waiting tenant's counter falls behind a running one's as that one is served (preemption.py)."""
        while True:
            await asyncio.sleep(interval)
            self.dispatch()
            if self.queue.num_queued:
                self.on_waiting()

    def collector(self, model: str) -> Collector:
        return AdmissionCollector(self, model)


class AdmissionCollector(Collector):
    """Queue length, wait and shed requests by class and tenant (the `tenant` label takes the tenants this gateway
    has seen queue or run, and ANONYMOUS)."""

    def __init__(self, admission: Admission, model: str) -> None:
        self.admission, self.model = admission, model

    def collect(self):
        admission = self.admission
        base = ["role", "model"]
        labels = [*base, "class", "tenant"]
        length = GaugeMetricFamily("tandem_gateway_queue_length", "Requests waiting in the admission queue.",
                                   labels=labels)
        wait = HistogramMetricFamily("tandem_gateway_queue_wait_seconds", "Time admitted requests waited in the "
                                     "admission queue (0 for those that found a free slot).", labels=labels)
        shed = CounterMetricFamily("tandem_gateway_queue_shed", "Requests refused by admission: queue_full (429) "
                                   "or queue_timeout (503, the class's deadline passed).",
                                   labels=[*labels, "reason"])
        queued = admission.queue.queued()
        for key in sorted(set(admission.stats) | set(queued)):
            values = ["gateway", self.model, *key]
            length.add_metric(values, queued.get(key, 0))
            stats = admission.stats.get(key) or WaitStats()
            wait.add_metric(values, [*((str(b), n) for b, n in zip(WAIT_BUCKETS, stats.buckets)),
                                     ("+Inf", stats.count)], stats.total)
            for reason, num in stats.shed.items():
                shed.add_metric([*values, reason], num)
        running = GaugeMetricFamily("tandem_gateway_admission_running", "Requests holding an admission slot.",
                                    labels=base)
        running.add_metric(["gateway", self.model], admission.num_running)
        capacity = GaugeMetricFamily("tandem_gateway_admission_capacity", "Requests that may run at once "
                                     "(each ready streaming worker's max_num_seqs + headroom, summed).", labels=base)
        capacity.add_metric(["gateway", self.model], admission.capacity())
        overloaded = GaugeMetricFamily("tandem_gateway_queue_overloaded", "1 while a class's band dispatches "
                                       f"newest first: one of its requests waited {OVERLOAD_SHARE:.0%} of its "
                                       "deadline.",
                                       labels=[*base, "class"])
        now = admission.clock()
        for priority_class in BANDS:
            overloaded.add_metric(["gateway", self.model, priority_class],
                                  int(admission.queue.overloaded(priority_class, now)))
        yield from (length, wait, shed, running, capacity, overloaded)

