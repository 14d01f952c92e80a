"""Reconcile runs the tried revision's workers beside stable's while a rollout is active, drains them when it is
aborted, and drains stable's after promotion; the endpoints answer carries each group's traffic weight."""
from __future__ import annotations

from controlplane.models import Pool, Worker, WorkerStatus
from controlplane.rollouts.models import Rollout
from controlplane.rollouts.services import rollout_abort, rollout_promote, rollout_start
from controlplane.selectors import deployment_endpoints


def _tried(deployment, rollout):
    return list(Worker.objects.filter(deployment=deployment, revision=rollout.revision).order_by("role"))


def test_the_tried_workers_start_beside_stable_sized_by_the_step_weight(steady, operator, reconcile, sent):
    Pool.objects.filter(deployment=steady, role="decode").update(desired_replicas=4, max_replicas=8)
    rollout = rollout_start(deployment=steady, actor=operator, revision=2, steps=[
        {"weight": 10, "duration_s": 5}, {"weight": 50, "duration_s": 5}])
    reconcile(steady)
    assert sorted(w.role for w in _tried(steady, rollout)) == ["decode", "prefill"]  # ceil(4 * 10%) = 1 each
    stable = Worker.objects.filter(deployment=steady, revision=steady.current_revision, status="ready")
    assert stable.count() == 2  # nothing of stable drained
    Rollout.objects.filter(pk=rollout.pk).update(step_index=1)
    reconcile(steady)
    assert sorted(w.role for w in _tried(steady, rollout)) == ["decode", "decode", "prefill"]  # ceil(4 * 50%) = 2


def test_ready_tried_workers_are_not_drained_while_the_rollout_runs(steady, operator, reconcile, make_tried_ready,
                                                                    sent):
    rollout = rollout_start(deployment=steady, actor=operator, revision=2, steps=[{"weight": 10, "duration_s": 5}])
    make_tried_ready(rollout)
    summary = reconcile(steady)
    assert summary["drained"] == [] and summary["created"] == []


def test_an_abort_drains_the_tried_workers_and_stable_gets_all_traffic(steady, operator, reconcile,
                                                                       make_tried_ready, sent):
    rollout = rollout_start(deployment=steady, actor=operator, revision=2, steps=[{"weight": 30, "duration_s": 5}])
    make_tried_ready(rollout)
    groups = {g["revision"]: g for g in deployment_endpoints(steady)["groups"]}
    assert (groups[2]["traffic_weight"], groups[1]["traffic_weight"]) == (30, 70)
    assert (groups[2]["variant"], groups[1]["variant"]) == ("canary", "stable")

    rollout_abort(rollout=rollout, actor=operator, reason="looks wrong")
    groups = {g["revision"]: g for g in deployment_endpoints(steady)["groups"]}
    assert (groups[2]["traffic_weight"], groups[1]["traffic_weight"]) == (0, 100)  # before any drain
    summary = reconcile(steady)
    assert sorted(summary["drained"]) == sorted(w.id for w in _tried(steady, rollout))
    assert all(w.status == WorkerStatus.DRAINING for w in _tried(steady, rollout))
    assert [g["revision"] for g in deployment_endpoints(steady)["groups"]] == [1]
    assert "traffic_weight" not in deployment_endpoints(steady)["groups"][0]


def test_promotion_fills_the_pools_of_the_new_revision_and_then_drains_stable(steady, operator, reconcile,
                                                                             make_tried_ready, sent):
    from controlplane.models import Action, ActionKind, ActionStatus

    rollout = rollout_start(deployment=steady, actor=operator, revision=2, steps=[{"weight": 10, "duration_s": 5}])
    make_tried_ready(rollout)
    old = list(Worker.objects.filter(deployment=steady, revision=rollout.stable_revision).exclude(role="gateway"))
    action = rollout_promote(rollout=rollout, actor=operator)
    steady.refresh_from_db()
    summary = reconcile(steady)
    assert sorted(summary["drained"]) == sorted(w.id for w in old)  # the tried workers already fill each pool
    Worker.objects.filter(id__in=[w.id for w in old]).update(status=WorkerStatus.STOPPED)
    reconcile(steady)
    assert Action.objects.get(pk=action.pk).status == ActionStatus.SUCCEEDED
    assert Action.objects.get(kind=ActionKind.PROMOTE).params["to_revision"] == 2


def test_without_a_rollout_the_answer_has_no_traffic_weights(steady):
    groups = deployment_endpoints(steady)["groups"]
    assert [g["revision"] for g in groups] == [1]
    assert "traffic_weight" not in groups[0] and "variant" not in groups[0]


def test_after_a_promotion_the_promoted_revision_gets_all_traffic_until_stable_is_gone(steady, operator,
                                                                                       make_tried_ready):
    rollout = rollout_start(deployment=steady, actor=operator, revision=2, steps=[{"weight": 10, "duration_s": 5}])
    make_tried_ready(rollout)
    rollout_promote(rollout=rollout, actor=operator)
    steady.refresh_from_db()
    groups = {g["revision"]: g["traffic_weight"] for g in deployment_endpoints(steady)["groups"]}
    assert groups == {2: 100, 1: 0}
    Worker.objects.filter(deployment=steady, revision__number=1).update(status=WorkerStatus.STOPPED)
    assert "traffic_weight" not in deployment_endpoints(steady)["groups"][0]
