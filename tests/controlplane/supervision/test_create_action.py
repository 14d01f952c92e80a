"""The `create` action of a deployment is its audit row: it finishes once every pool has its ready workers of
revision 1, or fails with the error of a worker that failed, instead of staying pending for ever."""
from __future__ import annotations

from django.utils import timezone

from controlplane.models import Action, ActionKind, ActionStatus, Worker, WorkerStatus


def _create_action(deployment):
    return Action.objects.get(deployment=deployment, kind=ActionKind.CREATE)


def test_the_create_action_succeeds_once_both_pools_have_their_ready_workers(
        deployment, online_node, sent, reconcile):
    reconcile(deployment)  # creates the pending prefill, decode and gateway workers
    action = _create_action(deployment)
    assert action.status == ActionStatus.RUNNING

    Worker.objects.filter(deployment=deployment, role="decode").update(status=WorkerStatus.READY)
    reconcile(deployment)
    assert _create_action(deployment).status == ActionStatus.RUNNING  # prefill still pending

    Worker.objects.filter(deployment=deployment, role="prefill").update(status=WorkerStatus.READY)
    reconcile(deployment)
    action = _create_action(deployment)
    assert action.status == ActionStatus.SUCCEEDED and action.result == {"revision": 1}
    assert action.finished_at is not None


def test_the_create_action_fails_with_the_error_of_a_worker_that_failed(deployment, online_node, sent, reconcile):
    reconcile(deployment)
    Worker.objects.filter(deployment=deployment, role="prefill").update(
        status=WorkerStatus.FAILED, stopped_at=timezone.now(), last_error="process exited (exit code 1)")
    reconcile(deployment)
    action = _create_action(deployment)
    assert action.status == ActionStatus.FAILED and "exit code 1" in action.error
