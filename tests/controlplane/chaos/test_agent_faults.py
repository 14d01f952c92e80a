"""The node agent's process faults on a real child process: a pause is released by the agent's own timer at its
deadline with no revert message (the broker and the control plane may be gone), or earlier by a revert; a kill
SIGKILLs it; a message delivered twice injects once; a late message or another node's worker is never signalled."""
from __future__ import annotations

import time

import pytest

from controlplane.agent import fault_holds, faults, runtime
from controlplane.models import Action, ActionStatus
from tests.controlplane.chaos.conftest import process_state, wait_until

AUDIT = {"chaos_run": 1, "experiment": "t"}


@pytest.mark.django_db(transaction=True)
def test_a_pause_is_released_by_the_agents_own_deadline(world):
    pid = world["handle"].pid
    outcome = faults.fault_inject(key="k-deadline", kind="pause", worker_id=world["decode"].pk,
                                  until=time.time() + 1.5, audit=AUDIT)
    assert outcome == "paused"
    wait_until("the worker to stop", lambda: process_state(pid) == "stopped")
    assert "k-deadline" in fault_holds.paused_keys()
    # No revert is ever sent: the timer in this (the agent's) process releases it.
    wait_until("the worker to run again", lambda: process_state(pid) in ("sleeping", "running"), timeout=15)
    assert "k-deadline" not in fault_holds.paused_keys()
    reverted = wait_until("the revert row", lambda: Action.objects.filter(
        idempotency_key=faults.reverted_key("k-deadline")).first())
    assert reverted.result["outcome"] == "resumed" and reverted.result["by"] == "the agent's deadline"
    assert reverted.params["event"] == "fault_reverted" and reverted.params["chaos_run"] == 1
    injected = Action.objects.get(idempotency_key=faults.injected_key("k-deadline"))
    assert injected.status == ActionStatus.SUCCEEDED and injected.result["pid"] == pid
    assert injected.worker_id == world["decode"].pk


@pytest.mark.django_db(transaction=True)
def test_a_revert_releases_a_pause_before_its_deadline(world):
    pid = world["handle"].pid
    faults.fault_inject(key="k-early", kind="pause", worker_id=world["decode"].pk, until=time.time() + 60,
                        audit=AUDIT)
    wait_until("the worker to stop", lambda: process_state(pid) == "stopped")
    assert faults.fault_revert(key="k-early", kind="pause", worker_id=world["decode"].pk, audit=AUDIT) == "resumed"
    wait_until("the worker to run again", lambda: process_state(pid) != "stopped")
    assert fault_holds.paused_keys() == []
    assert Action.objects.get(idempotency_key=faults.reverted_key("k-early")).result["by"] == "a revert"
    # A second revert (a re-delivered message) finds the row and does nothing.
    assert faults.fault_revert(key="k-early", kind="pause", worker_id=world["decode"].pk,
                               audit=AUDIT) == "already-reverted"


@pytest.mark.django_db(transaction=True)
def test_a_message_delivered_twice_pauses_once(world):
    until = time.time() + 30
    assert faults.fault_inject(key="k-twice", kind="pause", worker_id=world["decode"].pk, until=until,
                               audit=AUDIT) == "paused"
    assert faults.fault_inject(key="k-twice", kind="pause", worker_id=world["decode"].pk, until=until,
                               audit=AUDIT) == "duplicate"
    assert Action.objects.filter(idempotency_key=faults.injected_key("k-twice")).count() == 1
    assert faults.fault_revert(key="k-twice", kind="pause", worker_id=world["decode"].pk, audit=AUDIT) == "resumed"
    wait_until("the worker to run again", lambda: process_state(world["handle"].pid) != "stopped")


@pytest.mark.django_db(transaction=True)
def test_a_kill_sigkills_the_worker_and_has_nothing_to_revert(world):
    from controlplane.agent import processes

    handle = world["handle"]
    assert faults.fault_inject(key="k-kill", kind="kill", worker_id=world["decode"].pk, until=time.time() + 5,
                               audit=AUDIT) == "killed"
    assert processes.wait_exit(handle, 10)
    assert processes.exit_code(handle.pid) == -9
    assert faults.fault_revert(key="k-kill", kind="kill", worker_id=world["decode"].pk,
                               audit=AUDIT) == "nothing-to-revert"
    assert Action.objects.get(idempotency_key=faults.reverted_key("k-kill")).result["outcome"] == "nothing-to-revert"


@pytest.mark.django_db(transaction=True)
def test_a_pause_whose_deadline_passed_in_the_queue_is_not_injected(world):
    assert faults.fault_inject(key="k-late", kind="pause", worker_id=world["decode"].pk, until=time.time() - 1,
                               audit=AUDIT) == "expired"
    assert process_state(world["handle"].pid) != "stopped"
    row = Action.objects.get(idempotency_key=faults.injected_key("k-late"))
    assert row.status == ActionStatus.FAILED and "deadline passed" in row.result["error"]


@pytest.mark.django_db(transaction=True)
def test_another_nodes_worker_is_never_signalled(world, monkeypatch):
    monkeypatch.setattr(runtime, "node_name", "some-other-node")
    assert faults.fault_inject(key="k-node", kind="pause", worker_id=world["decode"].pk, until=time.time() + 30,
                               audit=AUDIT) == "gone"
    assert process_state(world["handle"].pid) != "stopped"


@pytest.mark.django_db(transaction=True)
def test_an_inject_that_arrives_after_its_revert_injects_nothing(world):
    pid = world["handle"].pid
    assert faults.fault_revert(key="k-late", kind="pause", worker_id=world["decode"].pk, audit=AUDIT) == "resumed"
    assert faults.fault_inject(key="k-late", kind="pause", worker_id=world["decode"].pk, until=time.time() + 60,
                               audit=AUDIT) == "cancelled"
    assert process_state(pid) in ("sleeping", "running") and fault_holds.paused_keys() == []
    injected = Action.objects.get(idempotency_key=faults.injected_key("k-late"))
    assert injected.status == ActionStatus.FAILED and injected.result["outcome"] == "cancelled"



@pytest.mark.django_db(transaction=True)
def test_a_paused_worker_that_is_stopped_ends_its_pause_once_and_is_not_resumed_later(world, settings):
    """One or the other: the worker's stop (a restart after failed health checks goes through the same) ends the
    pause with one revert row, `superseded`; its deadline then has nothing left to resume."""
    from controlplane.agent.workers import worker_stop

    settings.TANDEM_DRAIN_GRACE_S = 0
    pid = world["handle"].pid
    faults.fault_inject(key="k-stop", kind="pause", worker_id=world["decode"].pk, until=time.time() + 2,
                        audit=AUDIT)
    wait_until("the worker to stop", lambda: process_state(pid) == "stopped")
    assert worker_stop(worker_id=world["decode"].pk, node_name=None, deadline_s=10) == "stopped"
    assert fault_holds.paused_keys() == []  # its deadline's timer is cancelled: nothing left to resume
    reverted = Action.objects.get(idempotency_key=faults.reverted_key("k-stop"))
    assert (reverted.result["outcome"], reverted.result["by"]) == ("superseded", "its stop")
    assert process_state(pid) in ("gone", "zombie")
