"""A revert that overtakes its fault's start (a short fault: the agent runs the inject and the revert on two threads,
and a fault proxy takes a second to start) waits for the start, then undoes it: the row points back at the worker at
once and the revert says "restored", instead of "gone" with the fault left in place until its deadline."""
from __future__ import annotations

import threading
import time

import pytest
import requests

from controlplane.agent import fault_holds, faults
from controlplane.models import Action, Worker
from tests.controlplane.chaos.conftest import wait_until
from tests.controlplane.chaos.test_agent_proxy_faults import BODY, sim_decode  # noqa: F401 (a fixture)

AUDIT = {"chaos_run": 1, "experiment": "t"}
pytestmark = pytest.mark.integration


@pytest.mark.django_db(transaction=True)
def test_a_revert_during_the_proxys_start_waits_for_it_and_restores_the_row(sim_decode):  # noqa: F811
    port = sim_decode.port
    injected = {}
    inject = threading.Thread(target=lambda: injected.update(outcome=faults.fault_inject(
        key="race", kind="error", worker_id=sim_decode.pk, until=time.time() + 60, audit=AUDIT,
        params={"ratio": 1.0})))
    inject.start()
    try:
        wait_until("the proxy to be starting", lambda: "race" in fault_holds.starting, timeout=10)
        reverted = faults.fault_revert(key="race", kind="error", worker_id=sim_decode.pk, audit=AUDIT)
    finally:
        inject.join(timeout=30)
    assert injected["outcome"] == "proxied" and reverted == "restored"
    assert Worker.objects.get(pk=sim_decode.pk).port == port and fault_holds.paused_keys() == []
    # Told to stop (SIGTERM): it passes requests through while it drains, no longer failing them.
    proxy_port = Action.objects.get(idempotency_key=faults.injected_key("race")).result["proxy_port"]
    answer = requests.post(f"http://127.0.0.1:{proxy_port}/v1/generate", json=BODY, timeout=30)
    assert answer.status_code == 200, answer.text
