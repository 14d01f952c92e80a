"""Admission: a bounded queue per deployment in front of the workers, dispatched by priority band and, within a band,
fairly across tenants by the tokens they were served.

The gateway lets at most `capacity()` requests run at once (routing.Router.capacity: for each ready worker that holds
streams, colocated or decode, the max_num_seqs its /health reports + `--worker-capacity-headroom`, at most
`--max-outstanding-per-worker`). A request that finds them all taken waits here instead of getting a 429
straight away, up to its class's deadline (`--queue-deadline`); when a slot frees, the next request goes:

in the order fair_queue.py's docstring gives (strict priority by band, then each band's backlogged tenant with
the smallest virtual token counter).

Shed: 429 `queue_full` when `--admission-queue` requests already wait (0: admission steps aside and a full fleet
answers the router's straight 429 `overloaded`, as before there was a queue), 503
`queue_timeout` when a request's deadline passes while it waits; both with Retry-After. Anonymous callers are
told apart for fairness (fair_queue.py).

`FairQueue` (fair_queue.py) is the pure part (no asyncio, no clock: tested one decision at a time); `Admission` wraps
it with futures, deadlines and the series on /metrics.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from inference.gateway.fair_queue import BANDS, OVERLOAD_SHARE, FairQueue, Waiter, label_of
from inference.gateway.openai_protocol import ApiError

DEFAULT_MAX_QUEUED = 1024
# Slots per streaming worker beyond its max_num_seqs (--worker-capacity-headroom): a request or two waiting at the
# worker keep its batch full between one request's end and the next one's dispatch (docs/performance.md, tenants).
DEFAULT_HEADROOM = 2
DEFAULT_DEADLINES = {"interactive": 10.0, "standard": 30.0, "batch": 120.0}
WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
SHED_REASONS = ("queue_full", "queue_timeout")
RETRY_AFTER = "1"


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
        key = (priority_class, label_of(tenant))
        stats = self.stats.get(key)
        if stats is None:
            stats = self.stats[key] = WaitStats()
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
        for the next stream to end (many times a prefill's time on a worker beside several streams)."""
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
        queued: dict[tuple[str, str], int] = {}
        for (priority_class, tenant), num in admission.queue.queued().items():
            key = (priority_class, label_of(tenant))
            queued[key] = queued.get(key, 0) + num
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

