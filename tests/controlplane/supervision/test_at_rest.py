"""A reconcile pass leaves alone the deployments at rest (nothing reconcile would do), reconciles the others, and
reconciles each at-rest deployment in its turn, once a minute."""
from __future__ import annotations

import pytest

from controlplane.models import Action, ActionStatus, Pool, WorkerStatus
from controlplane.supervision import tasks
from controlplane.supervision.at_rest import deployments_at_rest


@pytest.fixture
def settled(deployment, make_worker):
    """`demo` as reconcile leaves it: its create action done, 1 prefill + 1 decode + the gateway ready."""
    Action.objects.filter(deployment=deployment).update(status=ActionStatus.SUCCEEDED)
    make_worker(deployment, "prefill")
    make_worker(deployment, "decode")
    make_worker(deployment, "gateway")
    return deployment


def test_a_settled_deployment_is_at_rest(settled):
    assert deployments_at_rest([settled.id]) == {settled.id}


@pytest.mark.parametrize("unsettle", [
    lambda d, make_worker: make_worker(d, "decode", status=WorkerStatus.PENDING),
    lambda d, make_worker: make_worker(d, "decode", status=WorkerStatus.DRAINING),
    lambda d, make_worker: Pool.objects.filter(deployment=d, role="decode").update(desired_replicas=2),
    lambda d, make_worker: Pool.objects.filter(deployment=d, role="prefill").update(unschedulable_reason="no node"),
    lambda d, make_worker: d.workers.filter(role="gateway").update(status=WorkerStatus.STOPPED),
    lambda d, make_worker: Action.objects.create(deployment=d, kind="scale", status=ActionStatus.PENDING,
                                                 actor_type="user", reason="test"),
], ids=["pending", "draining", "scaled", "unschedulable", "no-gateway", "unfinished-action"])
def test_anything_left_to_do_means_not_at_rest(settled, make_worker, unsettle):
    unsettle(settled, make_worker)
    assert deployments_at_rest([settled.id]) == set()


def test_a_pass_reconciles_only_the_deployments_not_at_rest(settled, make_deployment, monkeypatch):
    busy = make_deployment("busy")
    reconciled = []
    monkeypatch.setattr(tasks.reconcile, "reconcile_deployment", lambda deployment_id, **_: reconciled.append(
        deployment_id))
    monkeypatch.setattr(tasks, "_at_rest_turn", lambda ids, now: set())
    assert tasks.reconcile_all() == 1 and reconciled == [busy.id]
    monkeypatch.setattr(tasks, "_at_rest_turn", lambda ids, now: {settled.id})  # its turn: reconciled at rest too
    reconciled.clear()
    assert tasks.reconcile_all() == 2 and sorted(reconciled) == sorted([settled.id, busy.id])


def test_each_deployment_at_rest_gets_one_turn_per_full_pass_period_and_no_pass_takes_all(settings):
    settings.TANDEM_RECONCILE_INTERVAL_S = 5
    ids = list(range(1, 51))
    turns = [tasks._at_rest_turn(ids, 1_000_003.0 + 5 * k) for k in range(int(tasks.FULL_PASS_EVERY_S / 5))]
    assert sorted(d for turn in turns for d in turn) == ids  # each exactly once in 60 s
    assert max(len(turn) for turn in turns) == 5  # 50 deployments over 12 passes: at most 5 in one pass
