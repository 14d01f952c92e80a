"""Preemption: a waiting request that should go before a running one takes its place now, not when it ends.

Admission (admission.py) alone lets a quiet tenant's request wait for a noisy tenant's stream to end, since every
slot is held by streams that may run for minutes. When a request waits and the one that FairQueue would dispatch next
*outranks* a running request, the gateway preempts requests of the most-served tenant among those it outranks. A
waiting request outranks a running one of a lower priority band, and one of its own band of another tenant when
either
- its tenant's virtual token counter is lower than the running request's tenant's by more than `margin`, or
- its tenant is light beside the running request's: all it holds and has waiting, plus one, is within what the other
  holds (a quiet tenant's requests beside a flood; a tenant backlogged beyond that is left to the counters). The
  counters alone cannot see this case soon: a tenant that becomes backlogged is lifted to the counter of the others
  (admission.py), so a quiet tenant arriving beside a flood ties with it and would wait until the flood has been
  served `margin` more (quiet TTFT P50 many times its unloaded value instead of about the same); and a quiet tenant
  served alone before the flood began is ahead of it by all that, so its requests waited until the flood had caught
  up (tenants.py's isolation scenario on a real worker: the quiet tenant's requests of the first seconds of the flood
  waited seconds; the figures: docs/performance.md, "A quiet request's path, traced"). The rule asked first that
  nothing else of the tenant wait: once a second request of it queued behind the first, it was left to those counters.
  Its slots can never be taken back by the same rule: the flood, backlogged, holds and waits for more than the light
  tenant holds.

It preempts:

1. one streaming request (of the lowest band among those, then the most-served tenant, then one within the bounds
   below; the one that has sent the most tokens, which surely holds a sequence at its worker, where a newer one may
   still wait in the worker's own queue after its first token): its slot and its worker's outstanding count go to
   the waiter at once, then its worker request is closed (the worker frees the sequence and its KV blocks), the
   client's stream stays open;
2. every request of a tenant it outranks that holds a slot but has no first token yet (it waits in the worker's own
   queue, the `--worker-capacity-headroom` slots, and would take the freed sequence before the waiter could): it goes
   back to the queue having cost nothing but its place.

A preempted request goes back to the front of its tenant's queue, with no deadline (its client already waits on an
open answer; the request's own --request-timeout still bounds it), and when dispatched again resumes with the tokens
it already sent (`resume_token_ids`, as a migrated stream does, token_stream.py): the client sees a pause, never a
repeated, lost or wrong token (greedy output is the same as an unpreempted run's).

Bounds, within a band: a request is preempted at most `max_preemptions` times (0: never, which turns preemption off),
and not once it has fewer than `min_tokens_left` tokens of its max_tokens left (it will free its slot soon anyway);
they keep two tenants of a band from taking turns preempting each other through their counters. A request of a higher
band, and a light tenant's request beside a flood (the second rule above: the flood can never preempt back by it),
preempt whatever the victim's preemptions and tokens left, preferring one within the bounds, then one with
`min_tokens_left` left. Within the bounds alone a light tenant's request waited, once every slot held a request
preempted once already or near its end, for one of them to end (tenants.py's isolation scenario on a real worker: quiet
TTFT P99 many times its unloaded value). Across bands: a preempted request goes back to the front of its tenant's queue
and takes the next free slot, so under a `batch` flood every slot soon holds a batch request preempted once already, and
an `interactive` request that the bounds held back waited for one of them to end (bench/gateway/tenants.py's priority
scenario: interactive TTFT P99 many times its unloaded value, and a small multiple of it without the bounds across
bands; the figures: docs/performance.md, 'Tenants: admission queue and fair queuing'). A lower band never outranks a
higher one, so an `interactive` request is never preempted for a `standard` or `batch` one; one streaming preemption is
under way at a time. Preemptions are counted per class and tenant on /metrics.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from inference.gateway.admission import Admission, Slot
from inference.gateway.fair_queue import BANDS
from inference.gateway.tenant_quota import Ticket
from inference.gateway.token_stream import TokenStream

log = logging.getLogger("tandem.gateway.preemption")

DEFAULT_MAX_PREEMPTIONS = 1
# In virtual token counter units (admission.COMPLETION_WEIGHT per completion token): a waiting tenant must be this far
# behind before it preempts, so that two tenants served alike do not take turns preempting each other.
DEFAULT_MARGIN = 64.0
DEFAULT_MIN_TOKENS_LEFT = 16
# The longest a preempted stream keeps its worker sequence for the request its slot went to (Admission.hand_over).
HANDOFF_TIMEOUT_S = 1.0


@dataclass(slots=True)
class PreemptionSettings:
    max_preemptions: int = DEFAULT_MAX_PREEMPTIONS
    margin: float = DEFAULT_MARGIN
    min_tokens_left: int = DEFAULT_MIN_TOKENS_LEFT


class Preemptible:
    """One admitted request as preemption sees it: its ticket (tenant, class, current slot), how long it may still
    run, its stream once it has a first token, and the event that asks it to step aside."""

    __slots__ = ("ticket", "max_tokens", "stream", "num_preemptions", "requested", "releasing", "handoff")

    def __init__(self, ticket: Ticket, max_tokens: int | None) -> None:
        self.ticket, self.max_tokens = ticket, max_tokens
        self.stream: TokenStream | None = None
        self.num_preemptions = 0
        self.requested = asyncio.Event()  # set from the preemption until the request holds a slot again
        self.releasing = False  # asked to step aside, and its slot not yet freed
        self.handoff: asyncio.Event | None = None  # set once the request its slot went to reached its worker

    @property
    def num_sent(self) -> int:
        return len(self.stream.token_ids) if self.stream is not None else 0

    def tokens_left(self) -> float:
        return float("inf") if self.max_tokens is None else self.max_tokens - self.num_sent


class Preemption:
    def __init__(self, admission: Admission, settings: PreemptionSettings | None = None) -> None:
        self.admission, self.settings = admission, settings or PreemptionSettings()
        self.running: set[Preemptible] = set()
        self.counts: dict[tuple[str, str], int] = {}  # (class, tenant) → preemptions
        admission.on_waiting = self.consider

    def configure(self, settings: PreemptionSettings) -> None:
        self.settings = settings

    # -- the policy ---------------------------------------------------------------------------------------------------

    def _outranks(self, band: str, tenant: str, victim: Preemptible, holding: Counter[str]) -> str | None:
        """Why a waiting request of `tenant` in `band` outranks `victim`: "band" (a higher band), "light" (a quiet
        tenant's requests beside a flood), "counter" (its tenant's counter lower by the margin), or None."""
        victim_band, victim_tenant = victim.ticket.priority_class, victim.ticket.tenant
        if BANDS.index(band) != BANDS.index(victim_band):
            return "band" if BANDS.index(band) < BANDS.index(victim_band) else None
        if tenant == victim_tenant:
            return None
        waiting = len(self.admission.queue.bands[band].get(tenant, ()))
        if holding[tenant] + waiting + 1 <= holding[victim_tenant]:
            return "light"
        counters = self.admission.queue.counters
        return "counter" if counters.get(tenant, 0.0) + self.settings.margin < counters.get(victim_tenant, 0.0) else None

    def _within_bounds(self, victim: Preemptible) -> bool:
        return (victim.num_preemptions < self.settings.max_preemptions
                and victim.tokens_left() >= self.settings.min_tokens_left)

    def _eligible(self, why: str | None, victim: Preemptible) -> bool:
        """Whether `victim` may step aside for a request that outranks it for `why` (_outranks): the bounds hold for
        the counters' rule only."""
        finished = victim.stream is not None and victim.stream.finish is not None
        if why is None or finished or victim.requested.is_set():
            return False
        return why != "counter" or self._within_bounds(victim)

    def victims(self) -> list[Preemptible]:
        """Whom to preempt now for the request FairQueue would dispatch next (module docstring); [] for nobody."""
        head = self.admission.queue.peek()
        if head is None or not self.settings.max_preemptions:
            return []
        if any(p.releasing and p.stream is not None for p in self.running):
            return []  # one streaming preemption at a time: its slot is on its way to the waiter
        band, tenant = head
        holding = Counter(p.ticket.tenant for p in self.running if not p.requested.is_set())
        outranked = [p for p in self.running if self._eligible(self._outranks(band, tenant, p, holding), p)]
        streaming = [p for p in outranked if p.stream is not None]
        if not streaming:
            return []  # without a sequence to free, sending the queued-at-worker ones back gains the waiter nothing
        counters = self.admission.queue.counters
        # Beyond the bounds (a higher band or a light tenant's request waits), one with tokens enough left rather than
        # one about to end anyway.
        victim = max(streaming, key=lambda p: (BANDS.index(p.ticket.priority_class), counters.get(p.ticket.tenant, 0.0),
                                               self._within_bounds(p), p.tokens_left() >= self.settings.min_tokens_left,
                                               p.num_sent))
        return [victim, *(p for p in outranked if p.stream is None)]

    def consider(self) -> None:
        """Preempt whom `victims` names (called when a request starts to wait, and on admission's dispatch tick).

        The streaming victim's place (its admission slot and its worker's outstanding count) goes to the waiter at
        once, not when the victim's task has closed its leg: on a busy gateway that task runs a few event-loop turns
        later, a sizeable share of a quiet tenant's TTFT, more on a loaded host. Its worker frees
        the sequence when the leg closes; until then it holds one request more, which its --max-queue takes."""
        if self.admission.has_room():
            return
        victims = self.victims()
        for victim in victims:
            victim.releasing = True
            victim.requested.set()
        if victims:
            # victims[0] is the streaming one; pause() releases the slot again (a no-op) and closes the leg.
            victims[0].stream.release_workers()
            victims[0].handoff = self.admission.hand_over(victims[0].ticket.slot)

    # -- the request's side -------------------------------------------------------------------------------------------

    def attach(self, ticket: Ticket, max_tokens: int | None) -> Preemptible:
        handle = Preemptible(ticket, max_tokens)
        self.running.add(handle)
        return handle

    def detach(self, handle: Preemptible) -> None:
        self.running.discard(handle)

    async def start(self, handle: Preemptible, start: Callable[[int], Awaitable[TokenStream]]) -> TokenStream:
        """`start(n)`'s stream (relay.start: up to the first token; n, the request's preemptions so far, keeps each
        try's worker request id its own), taken back to the queue and started again each time the request is
        preempted before its first token."""
        while True:
            task = asyncio.ensure_future(start(handle.num_preemptions))
            requested = asyncio.ensure_future(handle.requested.wait())
            try:
                await asyncio.wait((task, requested), return_when=asyncio.FIRST_COMPLETED)
            finally:
                requested.cancel()
                if not task.done():
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            if not task.cancelled():
                stream = task.result()
                handle.stream = stream
                stream.preempt_requested, stream.pause = handle.requested, lambda: self.pause(handle)
                stream.handed_over = lambda: self.handed_over(handle)
                return stream
            await self.pause(handle)

    async def handed_over(self, handle: Preemptible) -> None:
        """Until the request that took the preempted one's slot has reached its worker (Admission.hand_over), at
        most HANDOFF_TIMEOUT_S."""
        handoff, handle.handoff = handle.handoff, None
        if handoff is not None:
            try:
                await asyncio.wait_for(handoff.wait(), HANDOFF_TIMEOUT_S)
            except TimeoutError:
                log.info("closing a preempted stream before the request its slot went to reached a worker")

    async def pause(self, handle: Preemptible) -> None:
        """Give the request's slot to the waiter and wait, at the front of its tenant's queue, for another."""
        ticket = handle.ticket
        handle.num_preemptions += 1
        key = (ticket.priority_class, ticket.tenant)
        self.counts[key] = self.counts.get(key, 0) + 1
        log.info("preempting a request of tenant %s (class %s) after %d tokens", ticket.tenant,
                 ticket.priority_class, handle.num_sent)
        old: Slot = ticket.slot
        old.release()
        handle.releasing = False
        ticket.slot = await self.admission.acquire(ticket.tenant, ticket.priority_class, requeued=True)
        handle.requested.clear()

    def collector(self, model: str) -> Collector:
        return PreemptionCollector(self, model)


class PreemptionCollector(Collector):
    def __init__(self, preemption: Preemption, model: str) -> None:
        self.preemption, self.model = preemption, model

    def collect(self):
        family = CounterMetricFamily("tandem_gateway_preemptions", "Running requests the gateway preempted for a "
                                     "waiting one that outranked them (resumed later with the tokens already sent).",
                                     labels=["role", "model", "class", "tenant"])
        for (priority_class, tenant), num in sorted(self.preemption.counts.items()):
            family.add_metric(["gateway", self.model, priority_class, tenant], num)
        yield family


def preemption_settings(settings: dict, defaults: PreemptionSettings) -> PreemptionSettings:
    """A deployment's checked admission settings' preemption fields (admission_settings.check_admission_settings)
    over the gateway's flags."""
    return PreemptionSettings(
        max_preemptions=settings.get("max_preemptions", defaults.max_preemptions),
        margin=settings.get("preempt_margin", defaults.margin),
        min_tokens_left=settings.get("preempt_min_tokens_left", defaults.min_tokens_left))
