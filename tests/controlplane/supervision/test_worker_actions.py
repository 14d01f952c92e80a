"""Operator restart and drain actions (left pending by the services) are carried out by the next reconcile pass,
and finished once their outcome is known."""
from __future__ import annotations

from controlplane.models import ActionStatus, Worker, WorkerStatus


def test_a_restart_of_a_ready_worker_starts_a_replacement_first_and_drains_it_once_that_is_ready(
        deployment, online_node, make_worker, admin, sent, reconcile):
    from controlplane.services import worker_restart

    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    worker = make_worker(deployment, "decode")
    action = worker_restart(worker=worker, actor=admin, reason="stuck")

    summary = reconcile(deployment)
    replacement, = Worker.objects.filter(id__in=summary["created"])
    worker.refresh_from_db()
    action.refresh_from_db()
    assert (replacement.role, replacement.replaces_id, replacement.status) == ("decode", worker.id, "pending")
    assert replacement.last_error == "restart requested by ada-admin: stuck"
    assert ("agent_start_worker", (replacement.id,), "node.local") in sent
    assert worker.status == WorkerStatus.READY and action.status == ActionStatus.RUNNING  # still serving

    assert reconcile(deployment)["created"] == []  # the replacement holds the pool's one decode slot
    Worker.objects.filter(id=replacement.id).update(status=WorkerStatus.READY)
    reconcile(deployment)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING and worker.last_error == f"replaced by worker {replacement.id}"
    assert ("agent_stop_worker", (worker.id, 10), "node.local") in sent

    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.STOPPED)
    assert reconcile(deployment)["created"] == []
    action.refresh_from_db()
    assert action.status == ActionStatus.SUCCEEDED and action.result["replacement"] == replacement.id


def test_a_restart_of_a_worker_that_is_not_ready_is_in_place(deployment, online_node, make_worker, admin, sent,
                                                            reconcile):
    from controlplane.services import worker_restart

    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    worker = make_worker(deployment, "decode", status=WorkerStatus.STARTING)
    worker_restart(worker=worker, actor=admin, reason="stuck")
    summary = reconcile(deployment)
    worker.refresh_from_db()
    assert summary["created"] == [] and worker.status == WorkerStatus.PENDING and worker.restart_count == 1
    assert worker.last_error == "restart requested by ada-admin: stuck"
    assert ("agent_start_worker", (worker.id,), "node.local") in sent


def test_a_failed_replacement_fails_the_action_and_the_old_worker_keeps_serving(
        deployment, online_node, make_worker, admin, sent, reconcile):
    from controlplane.services import worker_restart

    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    worker = make_worker(deployment, "decode")
    action = worker_restart(worker=worker, actor=admin)
    replacement, = Worker.objects.filter(id__in=reconcile(deployment)["created"])
    Worker.objects.filter(id=replacement.id).update(status=WorkerStatus.FAILED, last_error="out of memory")
    reconcile(deployment)
    action.refresh_from_db()
    worker.refresh_from_db()
    assert action.status == ActionStatus.FAILED and "out of memory" in action.error
    assert worker.status == WorkerStatus.READY


def test_a_restart_revives_a_failed_worker(deployment, online_node, make_worker, admin, sent, reconcile):
    from controlplane.services import worker_restart

    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    failed = make_worker(deployment, "decode", status=WorkerStatus.FAILED)
    worker_restart(worker=failed, actor=admin, reason="fixed the model folder")
    summary = reconcile(deployment)
    assert summary["created"] == [] and summary["started"] == [failed.id]


def test_a_drain_starts_the_replacement_first_and_succeeds_once_the_old_worker_stopped(
        deployment, online_node, make_worker, admin, sent, reconcile):
    from controlplane.services import worker_drain

    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    worker = make_worker(deployment, "decode")
    action = worker_drain(worker=worker, actor=admin, reason="host maintenance")

    summary = reconcile(deployment)
    replacement, = Worker.objects.filter(id__in=summary["created"])
    worker.refresh_from_db()
    assert replacement.role == "decode" and worker.status == WorkerStatus.READY

    Worker.objects.filter(id=replacement.id).update(status=WorkerStatus.READY)
    reconcile(deployment)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING
    assert ("agent_stop_worker", (worker.id, 10), "node.local") in sent

    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.STOPPED)
    reconcile(deployment)
    action.refresh_from_db()
    assert action.status == ActionStatus.SUCCEEDED


def test_a_restart_with_no_room_for_a_replacement_beside_it_is_in_place(deployment, online_node, make_worker,
                                                                         admin, sent, reconcile):
    from controlplane.models import Pool
    from controlplane.services import worker_restart

    online_node.gpus = [{"index": 0, "name": "NVIDIA H200", "memory_total_bytes": 141 << 30}]
    online_node.save(update_fields=["gpus"])
    Pool.objects.filter(deployment=deployment, role="decode").update(gpus_per_worker=1)
    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    worker = make_worker(deployment, "decode")  # holds the node's only GPU
    action = worker_restart(worker=worker, actor=admin, reason="stuck")
    summary = reconcile(deployment)
    worker.refresh_from_db()
    action.refresh_from_db()
    assert summary["created"] == [] and worker.status == WorkerStatus.PENDING and worker.restart_count == 1
    assert action.status == ActionStatus.RUNNING and ("agent_start_worker", (worker.id,), "node.local") in sent
