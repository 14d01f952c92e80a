"""The admission queue, one decision at a time: bands go in priority order, tenants of a band by their virtual token
counters (the smaller first, lifted on arrival so idle time earns no credit), and under backlog two tenants are
served tokens in equal shares whatever their demand; the queue is bounded (429 queue_full) and a request whose
class deadline passes is shed (503 queue_timeout), both with Retry-After; a freed slot goes to the next waiter."""
from __future__ import annotations

import asyncio

import pytest

from inference.gateway.admission import Admission
from inference.gateway.fair_queue import COMPLETION_WEIGHT, FairQueue, Waiter
from inference.gateway.openai_protocol import ApiError


def _waiter(tenant: str, priority_class: str = "standard") -> Waiter:
    return Waiter(tenant, priority_class, enqueued=0.0, deadline=30.0)


def _drain(queue: FairQueue) -> list[str]:
    order = []
    while (waiter := queue.pop()) is not None:
        order.append(waiter.tenant)
    return order


def test_it_dispatches_interactive_before_standard_before_batch():
    queue = FairQueue()
    for tenant, priority_class in [("b1", "batch"), ("s1", "standard"), ("i1", "interactive"), ("b2", "batch"),
                                   ("i2", "interactive")]:
        queue.push(_waiter(tenant, priority_class))
    assert _drain(queue) == ["i1", "i2", "s1", "b1", "b2"]
    assert queue.num_queued == 0


def test_the_tenant_with_the_smaller_counter_goes_first_and_one_tenant_keeps_its_order():
    queue = FairQueue()
    for tenant in ("a", "a", "b"):
        queue.push(_waiter(tenant))
    first_a = queue.bands["standard"]["a"][0]
    queue.charge("a", prompt_tokens=100)  # a request of a's that runs is served its prompt
    assert queue.pop().tenant == "b"
    assert queue.pop() is first_a


def test_two_backlogged_tenants_get_equal_token_shares_whatever_their_demand():
    """A floods (10 requests queued for each of B's), both always backlogged; every dispatched request is served
    20 prompt + 50 completion tokens. Over any window the tokens each got differ by at most one request's cost."""
    queue = FairQueue()
    for _ in range(200):
        queue.push(_waiter("a"))
    for _ in range(20):
        queue.push(_waiter("b"))
    served = {"a": 0, "b": 0}
    for _ in range(40):
        tenant = queue.pop().tenant
        queue.charge(tenant, prompt_tokens=20, completion_tokens=50)
        served[tenant] += 70
    assert served["a"] == served["b"] == 20 * 70


def test_a_tenant_that_was_idle_is_lifted_to_the_backlogged_minimum_instead_of_bursting():
    queue = FairQueue()
    for _ in range(10):
        queue.push(_waiter("busy"))
    for _ in range(5):
        tenant = queue.pop().tenant
        queue.charge(tenant, completion_tokens=100)
    assert queue.counters["busy"] == 5 * 100 * COMPLETION_WEIGHT
    queue.push(_waiter("late"))  # never served: its counter would be 0 without the lift
    assert queue.counters["late"] == queue.counters["busy"]
    queue.push(_waiter("late"))
    order = []
    for _ in range(4):
        tenant = queue.pop().tenant
        queue.charge(tenant, completion_tokens=100)
        order.append(tenant)
    assert order.count("late") == 2 and order.count("busy") == 2  # alternating, not two bursts of late first


def test_a_tie_of_counters_goes_to_the_tenant_holding_fewer_slots():
    """A quiet tenant lifted to a flood's counter ties with it; the flood holds every slot, so its counter is the one
    about to grow: the quiet tenant goes first now, not after the flood's next tokens are charged."""
    queue = FairQueue()
    for _ in range(3):
        queue.push(_waiter("flood"))
    queue.charge("flood", completion_tokens=100)
    queue.hold("flood", 8)
    queue.push(_waiter("quiet"))
    assert queue.counters["quiet"] == queue.counters["flood"]
    assert queue.peek() == ("standard", "quiet")
    assert queue.pop().tenant == "quiet"
    queue.hold("flood", -8)
    assert queue.holding == {}


def test_a_slot_is_held_by_its_tenant_until_released():
    async def scenario() -> None:
        admission = Admission(lambda: 2)
        first = await admission.acquire("a", "standard")
        second = await admission.acquire("b", "standard")
        assert admission.queue.holding == {"a": 1, "b": 1}
        first.release()
        first.release()
        assert admission.queue.holding == {"b": 1}
        second.release()
        assert admission.queue.holding == {} and admission.num_running == 0
    asyncio.run(scenario())


def test_a_tenant_arriving_at_an_empty_band_is_lifted_to_the_last_dispatched_counter():
    queue = FairQueue()
    queue.push(_waiter("a"))
    queue.pop()
    queue.charge("a", prompt_tokens=300)
    queue.push(_waiter("a"))
    queue.pop()  # a's counter (300) is the band's last
    queue.push(_waiter("b"))
    assert queue.counters["b"] == 300


def test_remove_takes_a_waiter_out_once():
    queue = FairQueue()
    waiter = _waiter("a")
    queue.push(waiter)
    assert queue.remove(waiter) and not queue.remove(waiter)
    assert queue.num_queued == 0 and queue.pop() is None and queue.queued() == {}


class Capacity:
    def __init__(self, slots: int) -> None:
        self.slots = slots

    def __call__(self) -> int:
        return self.slots


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 10))


def test_a_full_queue_answers_429_queue_full_with_retry_after():
    async def scenario():
        admission = Admission(Capacity(1), max_queued=1)
        running = await admission.acquire("a", "standard")
        waiting = asyncio.create_task(admission.acquire("a", "standard"))
        await asyncio.sleep(0)
        with pytest.raises(ApiError) as refused:
            await admission.acquire("b", "interactive")
        running.release()  # the waiter gets the slot
        (await waiting).release()
        return refused.value, admission

    error, admission = _run(scenario())
    assert error.status == 429 and error.code == "queue_full" and error.type == "rate_limit_error"
    assert error.headers["Retry-After"] == "1"
    assert admission.stats[("interactive", "b")].shed["queue_full"] == 1
    assert admission.num_running == 0


def test_no_queue_steps_aside_for_the_routers_straight_429():
    async def scenario():
        admission = Admission(Capacity(1), max_queued=0)
        await admission.acquire("a", "standard")
        await admission.acquire("a", "standard")  # the router answers 429 overloaded when the worker is full
        return admission

    admission = _run(scenario())
    assert admission.num_running == 2 and admission.queue.num_queued == 0


def test_a_request_past_its_class_deadline_is_shed_with_503_and_leaves_the_queue():
    async def scenario():
        admission = Admission(Capacity(1), deadlines={"interactive": 5.0, "standard": 5.0, "batch": 0.05})
        running = await admission.acquire("a", "standard")
        with pytest.raises(ApiError) as shed:
            await admission.acquire("b", "batch")
        assert admission.queue.num_queued == 0
        running.release()
        return shed.value, admission

    error, admission = _run(scenario())
    assert error.status == 503 and error.code == "queue_timeout" and error.headers["Retry-After"] == "1"
    assert "batch" in error.message
    assert admission.stats[("batch", "b")].shed["queue_timeout"] == 1


def test_a_tenant_served_alone_is_not_made_to_wait_behind_one_that_was_idle_meanwhile():
    """`quiet` served alone, one request at a time (never queued: its counter grows, nobody else's does); then
    `noisy` floods in, filling every slot and queueing more, and quiet's next request waits: it goes first when a
    slot frees (noisy was lifted to quiet's counter as it became active, and the tie goes to the tenant holding
    fewer slots). Before, noisy kept its old counter and its queued requests went first until it caught up."""
    async def scenario() -> dict:
        admission = Admission(Capacity(4))
        for _ in range(20):
            slot = await admission.acquire("quiet", "standard")
            slot.charge(prompt_tokens=4, completion_tokens=16)
            slot.release()
        flood = [await admission.acquire("noisy", "standard") for _ in range(4)]
        queued = [asyncio.create_task(admission.acquire("noisy", "standard")) for _ in range(3)]
        await asyncio.sleep(0)
        quiet = asyncio.create_task(admission.acquire("quiet", "standard"))
        await asyncio.sleep(0)
        assert admission.queue.queued() == {("standard", "noisy"): 3, ("standard", "quiet"): 1}
        flood[0].release()  # one slot frees: the waiter it goes to leaves the queue at once
        outcome = admission.queue.queued()
        for task in [quiet, *queued]:
            task.cancel()
        await asyncio.gather(quiet, *queued, return_exceptions=True)
        return outcome

    assert _run(scenario()) == {("standard", "noisy"): 3}


def test_a_freed_slot_goes_to_the_higher_band_and_the_wait_is_measured():
    clock = [0.0]

    async def scenario():
        admission = Admission(Capacity(1), clock=lambda: clock[0])
        running = await admission.acquire("a", "batch")
        batch = asyncio.create_task(admission.acquire("a", "batch"))
        await asyncio.sleep(0)
        interactive = asyncio.create_task(admission.acquire("b", "interactive"))
        await asyncio.sleep(0)
        clock[0] = 2.0
        running.release()
        slot = await interactive
        assert not batch.done()
        slot.release()
        (await batch).release()
        return admission

    admission = _run(scenario())
    stats = admission.stats[("interactive", "b")]
    assert stats.count == 1 and stats.total == 2.0
    assert admission.stats[("batch", "a")].count == 2  # one at once, one after 2 s
    assert admission.num_running == 0


def test_a_client_that_leaves_while_waiting_frees_its_place():
    async def scenario():
        admission = Admission(Capacity(1))
        running = await admission.acquire("a", "standard")
        waiting = asyncio.create_task(admission.acquire("b", "standard"))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        assert admission.queue.num_queued == 0
        running.release()
        return admission

    assert _run(scenario()).num_running == 0


def test_no_known_capacity_admits_and_leaves_the_answer_to_the_router():
    async def scenario():
        admission = Admission(Capacity(0), max_queued=0)
        return await admission.acquire("a", "standard")

    assert _run(scenario()).admission.num_running == 1
