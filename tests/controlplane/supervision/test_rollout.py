"""A new current revision replaces the workers of both pools: new ones start, old ones keep serving until every
pool has its desired ready workers of the new revision, then they are drained; the action finishes after."""
from __future__ import annotations

from django.utils import timezone

from controlplane.models import Action, ActionStatus, Revision, Worker, WorkerStatus


def _steady_on_revision_1(deployment, make_worker):
    first = Revision.objects.get(deployment=deployment, number=1)
    old = [make_worker(deployment, "prefill", revision=first), make_worker(deployment, "decode", revision=first)]
    make_worker(deployment, "gateway")
    return old


def _new_workers(deployment, revision):
    return list(Worker.objects.filter(deployment=deployment, revision=revision).order_by("role"))


def test_old_workers_keep_serving_until_both_pools_of_the_new_revision_are_ready(
        deployment, online_node, make_worker, second_revision, sent, reconcile):
    old = _steady_on_revision_1(deployment, make_worker)
    deployment.refresh_from_db()

    summary = reconcile(deployment)
    new = _new_workers(deployment, second_revision)
    assert [w.role for w in new] == ["decode", "prefill"] and summary["drained"] == []

    Worker.objects.filter(id=new[0].id).update(status=WorkerStatus.READY)  # decode ready, prefill still starting
    Worker.objects.filter(id=new[1].id).update(status=WorkerStatus.STARTING)
    assert reconcile(deployment)["drained"] == []
    assert all(Worker.objects.get(id=w.id).status == WorkerStatus.READY for w in old)

    Worker.objects.filter(id=new[1].id).update(status=WorkerStatus.READY)
    summary = reconcile(deployment)
    assert sorted(summary["drained"]) == sorted(w.id for w in old)
    assert all(Worker.objects.get(id=w.id).status == WorkerStatus.DRAINING for w in old)
    assert {m[1][0] for m in sent if m[0] == "agent_stop_worker"} == {w.id for w in old}


def test_an_old_worker_that_is_not_serving_yet_is_dropped_at_once(deployment, online_node, make_worker,
                                                                   second_revision, sent, reconcile):
    first = Revision.objects.get(deployment=deployment, number=1)
    make_worker(deployment, "prefill", revision=first)
    starting = make_worker(deployment, "decode", status=WorkerStatus.STARTING, revision=first)
    make_worker(deployment, "gateway")
    deployment.refresh_from_db()
    assert starting.id in reconcile(deployment)["drained"]


def test_the_revision_action_succeeds_when_no_worker_of_another_revision_is_left(
        deployment, online_node, make_worker, admin, sent, reconcile):
    from controlplane.services import revision_create

    old = _steady_on_revision_1(deployment, make_worker)
    action = revision_create(deployment=deployment, actor=admin, engine_settings={"threads": 1})
    deployment.refresh_from_db()
    reconcile(deployment)
    Worker.objects.filter(revision=deployment.current_revision).update(status=WorkerStatus.READY)
    reconcile(deployment)  # drains the old ones
    action.refresh_from_db()
    assert action.status == ActionStatus.RUNNING  # old ones still draining

    Worker.objects.filter(id__in=[w.id for w in old]).update(status=WorkerStatus.STOPPED)
    reconcile(deployment)
    action.refresh_from_db()
    assert action.status == ActionStatus.SUCCEEDED and action.result == {"revision": 2}


def test_the_rollout_action_fails_and_old_workers_keep_serving_when_a_new_worker_fails(
        deployment, online_node, make_worker, admin, sent, reconcile):
    from controlplane.services import revision_create

    old = _steady_on_revision_1(deployment, make_worker)
    action = revision_create(deployment=deployment, actor=admin, engine_settings={"threads": 1})
    deployment.refresh_from_db()
    reconcile(deployment)
    decode, prefill = _new_workers(deployment, deployment.current_revision)
    Worker.objects.filter(id=decode.id).update(status=WorkerStatus.FAILED, stopped_at=timezone.now(),
                                               last_error="process exited (exit code 1)")
    summary = reconcile(deployment)

    action.refresh_from_db()
    assert action.status == ActionStatus.FAILED and "exit code 1" in action.error
    assert summary["drained"] == [] and summary["created"] == []  # a failed worker keeps its slot
    assert all(Worker.objects.get(id=w.id).status == WorkerStatus.READY for w in old)
    assert not Action.objects.filter(kind="revision", status=ActionStatus.RUNNING).exists()
