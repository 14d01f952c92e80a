"""Overload: a band one of whose requests waited half its deadline dispatches each tenant's newest request first
(adaptive LIFO), so that those served are served soon and the oldest are shed at their deadline; a preempted request
going back still goes first, and a band that is not overloaded keeps arrival order."""
from __future__ import annotations

import asyncio

from inference.gateway.admission import Admission
from inference.gateway.fair_queue import OVERLOAD_SHARE, FairQueue, Waiter


def _waiter(name: str, enqueued: float, *, deadline_s: float = 10.0, requeued: bool = False) -> Waiter:
    # `tenant` carries a name per request here: one tenant's order is what these tests look at
    waiter = Waiter("t", "interactive", enqueued=enqueued, deadline=enqueued + deadline_s, requeued=requeued)
    waiter.future = name  # a label to read the order by (FairQueue never touches the future)
    return waiter


def _drain(queue: FairQueue, now: float) -> list[str]:
    order = []
    while (waiter := queue.pop(now)) is not None:
        order.append(waiter.future)
    return order


def test_a_band_within_half_its_deadline_keeps_arrival_order():
    queue = FairQueue()
    for i, name in enumerate(("r1", "r2", "r3")):
        queue.push(_waiter(name, enqueued=float(i)))
    now = OVERLOAD_SHARE * 10.0 - 0.01  # r1, the oldest, has waited just under half its 10 s
    assert not queue.overloaded("interactive", now)
    assert _drain(queue, now) == ["r1", "r2", "r3"]


def test_an_overloaded_band_dispatches_the_newest_first():
    queue = FairQueue()
    for i, name in enumerate(("r1", "r2", "r3")):
        queue.push(_waiter(name, enqueued=float(i)))
    now = OVERLOAD_SHARE * 10.0  # r1 has waited half its deadline
    assert queue.overloaded("interactive", now)
    assert queue.pop(now).future == "r3"
    assert queue.pop(now).future == "r2"
    assert queue.pop().future == "r1"  # without a time, the oldest, as before


def test_a_preempted_request_going_back_goes_first_even_when_overloaded():
    queue = FairQueue()
    for i, name in enumerate(("r1", "r2")):
        queue.push(_waiter(name, enqueued=float(i)))
    queue.push(_waiter("resumed", enqueued=6.0, requeued=True), front=True)
    now = 6.0  # r1 waited 6 of its 10 s: overloaded; the resumed request's own wait does not count
    assert _drain(queue, now) == ["resumed", "r2", "r1"]


def test_under_overload_a_freed_slot_goes_to_the_latest_arrival():
    clock = [0.0]

    class Capacity:
        def __call__(self) -> int:
            return 1

    async def scenario():
        admission = Admission(Capacity(), deadlines={"interactive": 10.0, "standard": 30.0, "batch": 120.0},
                              clock=lambda: clock[0])
        running = await admission.acquire("a", "interactive")
        waiting = []
        for second in range(8):  # one arrival a second while the only slot stays taken
            clock[0] = float(second)
            waiting.append(asyncio.create_task(admission.acquire("a", "interactive")))
            await asyncio.sleep(0)
        running.release()  # at 7 s: the first arrival has waited 7 s of its 10, the band is overloaded
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        served = [i for i, task in enumerate(waiting) if task in done]
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        return served, admission

    served, admission = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert served == [7]  # the newest arrival, which waited 0 s
    assert admission.stats[("interactive", "a")].total == 0.0
