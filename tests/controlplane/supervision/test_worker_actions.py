"""Operator restart and drain actions (left pending by the services) are carried out by the next reconcile pass,
and finished once their outcome is known."""
from __future__ import annotations

from controlplane.models import ActionStatus, Worker, WorkerStatus


def test_a_restart_puts_the_worker_back_to_pending_and_sends_its_start(deployment, online_node, make_worker, admin,
                                                                      sent, reconcile):
    from controlplane.services import worker_restart

    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    worker = make_worker(deployment, "decode")
    action = worker_restart(worker=worker, actor=admin, reason="stuck")

    reconcile(deployment)

    worker.refresh_from_db()
    action.refresh_from_db()
    assert worker.status == WorkerStatus.PENDING and worker.restart_count == 1
    assert worker.last_error == "restart requested by ada-admin: stuck"
    assert ("agent_start_worker", (worker.id,), "node.local") in sent
    assert action.status == ActionStatus.RUNNING  # until the health check sees it ready again


def test_a_restart_revives_a_failed_worker(deployment, online_node, make_worker, admin, sent, reconcile):
    from controlplane.services import worker_restart

    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    failed = make_worker(deployment, "decode", status=WorkerStatus.FAILED)
    worker_restart(worker=failed, actor=admin, reason="fixed the model folder")
    summary = reconcile(deployment)
    assert summary["created"] == [] and summary["started"] == [failed.id]


def test_a_drain_stops_the_worker_and_succeeds_once_it_stopped_while_a_replacement_starts(
        deployment, online_node, make_worker, admin, sent, reconcile):
    from controlplane.services import worker_drain

    make_worker(deployment, "prefill")
    make_worker(deployment, "gateway")
    worker = make_worker(deployment, "decode")
    action = worker_drain(worker=worker, actor=admin, reason="host maintenance")

    summary = reconcile(deployment)
    worker.refresh_from_db()
    assert worker.status == WorkerStatus.DRAINING
    assert ("agent_stop_worker", (worker.id, 10), "node.local") in sent
    replacement, = Worker.objects.filter(id__in=summary["created"])
    assert replacement.role == "decode"

    Worker.objects.filter(id=worker.id).update(status=WorkerStatus.STOPPED)
    reconcile(deployment)
    action.refresh_from_db()
    assert action.status == ActionStatus.SUCCEEDED
