"""Whom preemption picks, one decision at a time: for the request FairQueue would dispatch next, one streaming request
of the most-served tenant it outranks (a higher band; or its band, another tenant, and a counter lower by more than
the margin, or its tenant is light: all it holds and has waiting, plus one, within what the other holds) plus the outranked ones still waiting
for their first token; nobody of a higher band, nobody of its own band preempted max_preemptions times or with few
tokens left (a higher band, and a light tenant's request beside a flood, preempt whatever those bounds say), and one streaming
preemption at a time.
The streaming victim's slot goes to the waiter at once; the victim keeps its worker's sequence until a worker holds the
waiter's request."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

from inference.gateway.admission import Admission, Slot
from inference.gateway.fair_queue import Waiter
from inference.gateway.preemption import Preemption, PreemptionSettings


def _setup(settings: PreemptionSettings | None = None) -> Preemption:
    return Preemption(Admission(lambda: 2), settings or PreemptionSettings(max_preemptions=1, margin=10,
                                                                            min_tokens_left=4))


def _running(preemption: Preemption, tenant: str, priority_class: str = "standard", *, num_sent: int | None = 5,
             max_tokens: int | None = 100):
    slot = SimpleNamespace(num_releases=0)
    slot.release = lambda: setattr(slot, "num_releases", slot.num_releases + 1)
    handle = preemption.attach(SimpleNamespace(tenant=tenant, priority_class=priority_class, slot=slot), max_tokens)
    if num_sent is not None:
        handle.stream = SimpleNamespace(token_ids=[0] * num_sent, finish=None, num_worker_releases=0)
        handle.stream.release_workers = lambda: setattr(handle.stream, "num_worker_releases",
                                                        handle.stream.num_worker_releases + 1)
    return handle


def _wait(preemption: Preemption, tenant: str, priority_class: str = "standard") -> None:
    preemption.admission.queue.push(Waiter(tenant, priority_class, enqueued=0.0, deadline=30.0))


def test_a_tenant_served_less_by_more_than_the_margin_preempts_the_most_served_one():
    preemption = _setup()
    counters = preemption.admission.queue.counters
    a_short, a_long, c = _running(preemption, "a", num_sent=5), _running(preemption, "a", num_sent=50), \
        _running(preemption, "c")
    a_starting = _running(preemption, "a", num_sent=None)
    _running(preemption, "b"), _running(preemption, "b")  # b holds two slots: the slot rule leaves a's three alone
    counters.update(a=100.0, c=60.0)
    _wait(preemption, "b")
    counters["b"] = 95.0
    assert preemption.victims() == []  # within the margin of a (and c is not above b)
    counters["b"] = 50.0
    assert preemption.victims() == [a_long, a_starting]  # a's longest stream, and a's one still waiting at its worker
    assert a_short not in preemption.victims() and c not in preemption.victims()


def test_a_lone_request_of_a_tenant_holding_two_slots_fewer_preempts_though_lifted_to_the_same_counter():
    preemption = _setup()
    _running(preemption, "a")
    preemption.admission.queue.counters.update(a=100.0, b=100.0)
    _wait(preemption, "b")
    assert preemption.victims() == []  # one slot against none: swapping them would gain nothing
    second = _running(preemption, "a", num_sent=50)
    assert preemption.victims() == [second]
    _wait(preemption, "b")
    assert preemption.victims() == []  # b holds and waits for as much as a holds: the counters decide


def test_a_light_tenant_with_a_few_requests_waiting_preempts_a_flood_though_its_counter_is_ahead():
    """A quiet tenant served alone before a flood began is ahead of it by all that: on a real SmolLM2 worker its
    requests of the flood's first seconds waited 1.7-2.1 s once a second one queued behind the first (tenants.py)."""
    preemption = _setup()
    flood = [_running(preemption, "noisy", num_sent=n) for n in (10, 20, 30, 40, 50)]
    preemption.admission.queue.counters.update(quiet=500.0, noisy=100.0)  # quiet far ahead
    for _ in range(3):
        _wait(preemption, "quiet")
    assert preemption.victims() == [flood[-1]]  # 0 held + 3 waiting + 1 <= 5: light
    _running(preemption, "quiet")
    assert preemption.victims() == [flood[-1]]  # 1 + 3 + 1 <= 5
    _running(preemption, "quiet")
    assert preemption.victims() == []  # 2 + 3 + 1 > 5: quiet's demand is no longer light beside the flood's
    # The flood, backlogged, never outranks the quiet tenant by this rule (the counters alike: theirs is not at play).
    preemption.admission.queue.bands["standard"].pop("quiet")
    preemption.admission.queue.counters.update(quiet=100.0, noisy=100.0)
    _wait(preemption, "noisy")
    assert preemption.victims() == []


def test_a_tenant_never_preempts_itself():
    preemption = _setup()
    _running(preemption, "a")
    preemption.admission.queue.counters["a"] = 1000.0
    _wait(preemption, "a")
    assert preemption.victims() == []


def test_a_higher_band_preempts_a_lower_one_whatever_the_counters_but_never_the_reverse():
    preemption = _setup()
    bulk = _running(preemption, "bulk", "batch")
    preemption.admission.queue.counters.update(bulk=0.0, chat=1e6)
    _wait(preemption, "chat", "interactive")
    assert preemption.victims() == [bulk]

    preemption = _setup()
    _running(preemption, "chat", "interactive")
    preemption.admission.queue.counters.update(chat=1e6, bulk=0.0)
    _wait(preemption, "bulk", "batch")
    assert preemption.victims() == []


def test_the_bounds_protect_a_request_from_the_counters_rule():
    preemption = _setup()
    tired = _running(preemption, "a")
    tired.num_preemptions = 1  # max_preemptions
    _running(preemption, "a", num_sent=97)  # 3 tokens left, under min_tokens_left
    _running(preemption, "a", num_sent=None)  # no stream to free: sending it back alone gains nothing
    preemption.admission.queue.counters["a"] = 100.0
    for _ in range(3):  # b backlogged (0 held + 3 waiting + 1 > a's 3): its counter, lower by the margin, is the rule
        _wait(preemption, "b")
    assert preemption.victims() == []


def test_a_light_tenants_request_beside_a_flood_preempts_whatever_the_bounds_say_preferring_one_within_them():
    """Under a flood every slot soon holds a request preempted once already or near its end: within the bounds a
    quiet tenant's lone request waited for one of them to end (a real SmolLM2 worker: TTFT P99 19x unloaded)."""
    preemption = _setup()
    tired = _running(preemption, "a", num_sent=50)
    tired.num_preemptions = 1  # max_preemptions
    ending = _running(preemption, "a", num_sent=97)  # 3 tokens left, under min_tokens_left
    _wait(preemption, "b")
    assert preemption.victims() == [tired]  # rather than the one about to end anyway
    fresh = _running(preemption, "a", num_sent=10)
    assert preemption.victims() == [fresh]  # one within the bounds first
    fresh.requested.set()  # stepping aside already
    assert preemption.victims() == [tired]
    assert ending not in preemption.victims()


def test_the_bounds_hold_within_a_band_only_so_a_higher_band_preempts_a_lower_one_whatever_they_say():
    """Under a batch flood every slot soon holds a batch request preempted once already (it goes back to the front of
    its queue and takes the next free slot): an interactive request that the bounds held back waited for one to end."""
    preemption = _setup()
    tired = _running(preemption, "bulk", "batch", num_sent=50)
    tired.num_preemptions = 1  # max_preemptions
    ending = _running(preemption, "bulk", "batch", num_sent=97)  # 3 tokens left, under min_tokens_left
    _wait(preemption, "chat", "interactive")
    assert preemption.victims() == [tired]  # rather than the one about to end anyway
    tired.num_preemptions = 0
    assert preemption.victims() == [tired]
    tired.num_preemptions = 1
    fresh = _running(preemption, "bulk", "batch", num_sent=10)
    assert preemption.victims() == [fresh]  # one within the bounds first
    fresh.requested.set(), tired.requested.set()  # stepping aside already
    assert preemption.victims() == [ending]

    same_band = _setup()  # for a request of its own band, the bounds still protect it
    tired = _running(same_band, "bulk", "batch", num_sent=50)
    tired.num_preemptions = 1
    _running(same_band, "bulk", "batch", num_sent=97)
    same_band.admission.queue.counters["bulk"] = 100.0
    _wait(same_band, "other", "batch"), _wait(same_band, "other", "batch")  # backlogged: the counters' rule
    assert same_band.victims() == []

    off = _setup(PreemptionSettings(max_preemptions=0))  # 0 still turns preemption off
    _running(off, "bulk", "batch")
    _wait(off, "chat", "interactive")
    assert off.victims() == []


def test_one_streaming_preemption_at_a_time():
    preemption = _setup()
    first, second = _running(preemption, "a"), _running(preemption, "a")
    preemption.admission.queue.counters["a"] = 100.0
    _wait(preemption, "b")
    preemption.admission.num_running = 2  # every slot held
    preemption.consider()
    assert [first.requested.is_set(), second.requested.is_set()].count(True) == 1
    assert [first.ticket.slot.num_releases, second.ticket.slot.num_releases] == \
        [int(first.requested.is_set()), int(second.requested.is_set())]
    assert preemption.victims() == []


def test_the_streaming_victims_slot_goes_to_the_waiter_before_the_victim_steps_aside():
    """The waiter is admitted inside the call that queues it, not when the victim's task next runs."""
    async def scenario() -> None:
        preemption = _setup()
        admission = preemption.admission
        handles = []
        for num_sent in (5, 50):
            handle = _running(preemption, "a", num_sent=num_sent)
            handle.ticket.slot = await admission.acquire("a", "standard")
            handles.append(handle)
        admission.queue.counters["a"] = 100.0
        waiting = asyncio.get_running_loop().create_task(admission.acquire("b", "standard"))
        await asyncio.sleep(0)  # acquire queues b and preempts
        assert admission.queue.num_queued == 0  # b's slot is given: nothing of a's has run, nor will
        assert isinstance(await asyncio.wait_for(waiting, 5), Slot)
        assert handles[1].requested.is_set() and not handles[0].requested.is_set()
        assert admission.num_running == 2 and admission.queue.holding == {"a": 1, "b": 1}
        assert [h.stream.num_worker_releases for h in handles] == [0, 1]  # the router may pick its worker now
        handles[1].ticket.slot.release()  # what the victim's pause() does later changes nothing
        assert admission.num_running == 2
    asyncio.run(scenario())


def test_the_victim_keeps_its_worker_sequence_until_the_waiters_request_reached_its_worker():
    """Admission.hand_over: the victim closes its leg (freeing its sequence on the worker) once the request its slot
    went to is held by a worker (Slot.handed_over, which the relay calls then) or gave up its slot, and at once when
    no request took it; a waiter that never gets there keeps the victim at most HANDOFF_TIMEOUT_S."""
    async def scenario() -> None:
        preemption = _setup()
        admission = preemption.admission
        victim = _running(preemption, "a", num_sent=50)
        victim.ticket.slot = await admission.acquire("a", "standard")
        await admission.acquire("a", "standard")
        admission.queue.counters["a"] = 100.0
        waiter = await asyncio.wait_for(admission.acquire("b", "standard"), 5)  # preempts the victim
        assert victim.requested.is_set() and victim.handoff is not None and waiter.handoff is victim.handoff
        stepping_aside = asyncio.get_running_loop().create_task(preemption.handed_over(victim))
        await asyncio.sleep(0.05)
        assert not stepping_aside.done(), "the waiter's request is not at a worker yet"
        waiter.handed_over()
        await asyncio.wait_for(stepping_aside, 5)
        assert victim.handoff is None

        alone = Admission(lambda: 1)
        slot = await alone.acquire("a", "standard")
        assert alone.hand_over(slot).is_set(), "no waiter: nothing to wait for"

        gives_up = Admission(lambda: 1)
        slot = await gives_up.acquire("a", "standard")
        later = asyncio.get_running_loop().create_task(gives_up.acquire("b", "standard"))
        await asyncio.sleep(0)
        handoff = gives_up.hand_over(slot)
        (await later).release()  # it failed before any worker held it
        assert handoff.is_set()

    asyncio.run(scenario())


def test_a_waiter_that_never_reaches_a_worker_keeps_the_victim_at_most_the_timeout(monkeypatch):
    from inference.gateway import preemption as module

    monkeypatch.setattr(module, "HANDOFF_TIMEOUT_S", 0.05)

    async def scenario() -> None:
        preemption = _setup()
        victim = _running(preemption, "a")
        victim.handoff = asyncio.Event()
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(preemption.handed_over(victim), 5)
        assert asyncio.get_running_loop().time() - started >= 0.05
    asyncio.run(scenario())
