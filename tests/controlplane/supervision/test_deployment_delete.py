"""A pending delete drains every worker and the gateway; once nothing runs, the deployment row goes and the delete
action succeeds; the audit log keeps the deployment's name."""
from __future__ import annotations

from controlplane.models import Action, ActionStatus, Deployment, Worker, WorkerStatus


def test_delete_drains_everything_then_deletes_the_row(deployment, online_node, make_worker, admin, sent,
                                                       reconcile):
    from controlplane.services import deployment_delete

    workers = [make_worker(deployment, role) for role in ("prefill", "decode", "gateway")]
    action = deployment_delete(deployment=deployment, actor=admin, reason="done with it")

    summary = reconcile(deployment)
    assert sorted(summary["drained"]) == sorted(w.id for w in workers) and not summary["deleted"]
    assert summary["created"] == []  # nothing new starts for a deployment being deleted
    assert Worker.objects.filter(deployment=deployment, status=WorkerStatus.DRAINING).count() == 3
    action.refresh_from_db()
    assert action.status == ActionStatus.RUNNING

    Worker.objects.filter(deployment=deployment).update(status=WorkerStatus.STOPPED)
    assert reconcile(deployment)["deleted"] is True
    assert not Deployment.objects.filter(name="demo").exists()
    action.refresh_from_db()
    assert action.status == ActionStatus.SUCCEEDED and action.deployment is None
    assert Action.objects.filter(deployment_name="demo", kind="create").exists()


def test_delete_fails_the_operator_actions_still_waiting(deployment, online_node, make_worker, admin, sent,
                                                        reconcile):
    from controlplane.services import deployment_delete, worker_restart

    worker = make_worker(deployment, "decode")
    restart = worker_restart(worker=worker, actor=admin, reason="")
    deployment_delete(deployment=deployment, actor=admin)
    reconcile(deployment)
    restart.refresh_from_db()
    assert restart.status == ActionStatus.FAILED and restart.error == "the deployment was deleted"
