"""Whom preemption picks, one decision at a time: for the request FairQueue would dispatch next, one streaming request
of the most-served tenant it outranks (a higher band; or its band, another tenant, and a counter lower by more than
the margin, or nothing else of its tenant waits and it holds two slots fewer) plus the outranked ones still waiting
for their first token; nobody of a higher band, nobody preempted max_preemptions times or with few tokens left, and
one streaming preemption at a time."""
from __future__ import annotations

from types import SimpleNamespace

from inference.gateway.admission import Admission, Waiter
from inference.gateway.preemption import Preemption, PreemptionSettings


def _setup(settings: PreemptionSettings | None = None) -> Preemption:
    return Preemption(Admission(lambda: 2), settings or PreemptionSettings(max_preemptions=1, margin=10,
                                                                            min_tokens_left=4))


def _running(preemption: Preemption, tenant: str, priority_class: str = "standard", *, num_sent: int | None = 5,
             max_tokens: int | None = 100):
    handle = preemption.attach(SimpleNamespace(tenant=tenant, priority_class=priority_class), max_tokens)
    if num_sent is not None:
        handle.stream = SimpleNamespace(token_ids=[0] * num_sent, finish=None)
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
    assert preemption.victims() == []  # b is backlogged: the counters decide


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


def test_the_bounds_protect_a_request():
    preemption = _setup()
    tired = _running(preemption, "a")
    tired.num_preemptions = 1  # max_preemptions
    _running(preemption, "a", num_sent=97)  # 3 tokens left, under min_tokens_left
    _running(preemption, "a", num_sent=None)  # no stream to free: sending it back alone gains nothing
    preemption.admission.queue.counters["a"] = 100.0
    _wait(preemption, "b")
    assert preemption.victims() == []


def test_one_streaming_preemption_at_a_time():
    preemption = _setup()
    first, second = _running(preemption, "a"), _running(preemption, "a")
    preemption.admission.queue.counters["a"] = 100.0
    _wait(preemption, "b")
    preemption.admission.num_running = 2  # every slot held
    preemption.consider()
    assert [first.requested.is_set(), second.requested.is_set()].count(True) == 1
    assert preemption.victims() == []
