"""Callers of an open deployment are told apart for fairness (not authenticated): by their `user` field where they
send one, else their connection's address, into a bounded set of keys; a quiet anonymous caller beside an anonymous
flood is served in its turn, not behind the flood's queue; the series count every anonymous caller as one."""
from __future__ import annotations

import asyncio

from inference.gateway.admission import Admission
from inference.gateway.fair_queue import ANONYMOUS, ANONYMOUS_BUCKETS, FairQueue, Waiter, label_of
from inference.gateway.tenancy import TenantGate, anonymous_key
from inference.gateway.tenant_policy import OPEN


def test_callers_get_keys_of_their_own_bounded_in_number():
    assert anonymous_key("10.0.0.1") == anonymous_key("10.0.0.1") != anonymous_key("10.0.0.2")
    keys = {anonymous_key(f"10.0.{i // 256}.{i % 256}") for i in range(5000)}
    assert len(keys) == ANONYMOUS_BUCKETS and all(label_of(key) == ANONYMOUS for key in keys)
    gate = TenantGate(lambda: OPEN)
    by_user = gate.admit(None, {}, {}, caller="alice")
    assert by_user.tenant == anonymous_key("alice") and by_user.tenant.startswith(f"{ANONYMOUS}:")


def test_a_quiet_anonymous_caller_goes_before_the_rest_of_an_anonymous_flood():
    queue = FairQueue()
    flood, quiet = anonymous_key("10.0.0.1"), anonymous_key("10.0.0.9")
    assert flood != quiet
    for _ in range(20):
        queue.push(Waiter(flood, "standard", enqueued=0.0, deadline=30.0))
    queue.push(Waiter(quiet, "standard", enqueued=0.0, deadline=30.0))
    first = queue.pop()
    queue.charge(first.tenant, prompt_tokens=10, completion_tokens=100)
    assert queue.pop().tenant == quiet  # not 20th


def test_the_series_count_every_anonymous_caller_as_one():
    async def run():
        admission = Admission(lambda: 1, max_queued=100)
        slot = await admission.acquire(anonymous_key("10.0.0.1"), "standard")
        waiting = [asyncio.ensure_future(admission.acquire(anonymous_key(f"10.0.0.{i}"), "standard"))
                   for i in range(2, 12)]
        await asyncio.sleep(0)
        families = {f.name: f for f in admission.collector("demo").collect()}
        tenants = {s.labels["tenant"] for s in families["tandem_gateway_queue_length"].samples}
        length = sum(s.value for s in families["tandem_gateway_queue_length"].samples)
        slot.release()
        for future in waiting:
            future.cancel()
        return tenants, length
    tenants, length = asyncio.run(run())
    assert tenants == {ANONYMOUS} and length == 10
