"""The gateway's admission queue in simulated time: the gateway's own order (inference/gateway/fair_queue.py's
FairQueue: strict priority bands, per-tenant virtual token counters, newest first in an overloaded band) around a
bound on the requests running.

As the gateway's Admission: a request is admitted at once while none waits and a slot is free; else it waits,
unless queue_size already wait (shed: queue_full); one still waiting queue_timeout_s after it came is shed
(queue_timeout); each freed slot goes to the next in FairQueue order. Differences: the bound is max_running (or
the gateway's own, max_num_seqs + headroom per serving streaming worker, with `headroom`), and queue_size 0 sheds
whatever finds no slot (the gateway's 0 turns the queue off and lets the router answer); a tenant's counter is
charged its prompt at its first token and its completion when it ends, not token by token; the gateway's
preemption of running requests for waiting ones (preemption.py) is left out.

fair=False keys every request to one tenant: arrival order within each band. priority_weights puts every class
in one band and divides each tenant's charges by its class's weight.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from inference.gateway.fair_queue import FairQueue, Waiter

from controlplane.replay.sim.model import DEFAULT_CLASS, Admission
from controlplane.replay.sim.state import Flight

ONE_TENANT = ""  # fair=False: every request is this tenant's


class GatewayQueue:
    def __init__(self, settings: Admission, capacity: Callable[[], float]) -> None:
        self.settings, self.capacity = settings, capacity
        self.queue = FairQueue()
        self.num_running = 0

    def _tenant(self, flight: Flight) -> str:
        return flight.tenant if self.settings.fair else ONE_TENANT

    def _band(self, flight: Flight) -> str:
        return DEFAULT_CLASS if self.settings.priority_weights else flight.band

    def _weight(self, flight: Flight) -> float:
        weights = self.settings.priority_weights
        return weights.get(flight.band, 1.0) if weights else 1.0

    @property
    def num_queued(self) -> int:
        return self.queue.num_queued

    def offer(self, flight: Flight, now: float) -> str:
        """"run" (admitted now), "wait" (queued: flight.waiter) or "queue_full" (shed)."""
        capacity = self.capacity()
        # No capacity known (no serving worker): admitted, for the router to refuse, as the gateway does.
        if capacity <= 0 or (not self.queue.num_queued and self.num_running < capacity):
            self._admit(flight)
            return "run"
        size = self.settings.queue_size
        if size is not None and self.queue.num_queued >= size:
            return "queue_full"
        timeout = self.settings.queue_timeout_s
        waiter = Waiter(self._tenant(flight), self._band(flight), now,
                        now + timeout if timeout is not None else math.inf, future=flight)
        self.queue.push(waiter)
        flight.waiter = waiter
        return "wait"

    def take(self, now: float) -> list[Flight]:
        """The waiting requests that free slots admit now, in FairQueue order."""
        admitted = []
        while self.queue.num_queued and self.num_running < self.capacity():
            flight = self.queue.pop(now).future
            flight.waiter = None
            self._admit(flight)
            admitted.append(flight)
        return admitted

    def expire(self, flight: Flight) -> bool:
        """Its deadline passed: out of the queue (False: it was admitted meanwhile)."""
        if flight.waiter is None or not self.queue.remove(flight.waiter):
            return False
        flight.waiter = None
        return True

    def _admit(self, flight: Flight) -> None:
        tenant = self._tenant(flight)
        self.queue.admitted(tenant, self._band(flight))
        self.queue.hold(tenant, 1)
        self.num_running += 1

    def release(self, flight: Flight) -> None:
        """Its slot frees (served, or shed by the router after admission)."""
        self.num_running -= 1
        self.queue.hold(self._tenant(flight), -1)

    def charge(self, flight: Flight, prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        weight = self._weight(flight)
        self.queue.charge(self._tenant(flight), prompt_tokens / weight, completion_tokens / weight)
