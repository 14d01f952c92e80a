"""Operator actions on one worker. They record a pending action with the worker; supervision carries it
out and finishes the action: restart = stop then start again in place; drain = leave the gateway membership,
finish in-flight requests, stop — the pool keeps its desired count, so reconcile starts a replacement (scale the
pool down to shrink it)."""
from __future__ import annotations


from controlplane.errors import conflict, invalid
from controlplane.models import Action, ActionKind, Worker, WorkerRole, WorkerStatus
from controlplane.models.actions import UNFINISHED_STATUSES
from controlplane.selectors import deployment_delete_pending
from controlplane.services.actions import action_create, action_once, as_actor, enqueue_reconcile


def _lock_worker(worker: Worker) -> Worker:
    worker = Worker.objects.select_for_update(of=("self",)).select_related("deployment").get(pk=worker.pk)
    if worker.deployment_id is None:
        # Its reconcile (supervision.shared_gateways) carries out no operator action: it restarts the process
        # itself when it fails or needs a new deployment's key, and stops it when it serves none.
        raise conflict(f"worker {worker.pk} is a shared gateway's process: it follows its attached deployments")
    if deployment_delete_pending(worker.deployment) is not None:
        raise conflict(f"deployment {worker.deployment.name!r} is being deleted")
    busy = (Action.objects.filter(worker=worker, kind__in=[ActionKind.RESTART, ActionKind.DRAIN],
                                  status__in=UNFINISHED_STATUSES).order_by("id").first())
    if busy is not None:
        raise conflict(f"worker {worker.pk} already has a {busy.kind} in progress (action {busy.pk})",
                       action_id=busy.pk)
    return worker


def worker_restart(*, worker: Worker, actor, reason: str = "",
                   idempotency_key: str | None = None) -> Action:
    """Ask for a worker's process to be restarted (a failed worker too: this is how an operator revives it).
    409 for a stopped worker, one being drained, or one with a restart/drain already in progress."""
    def check(locked: Worker) -> None:
        if locked.status in (WorkerStatus.STOPPED, WorkerStatus.DRAINING):
            raise conflict(f"worker {locked.pk} is {locked.status}; it cannot be restarted")

    return _worker_action(ActionKind.RESTART, worker=worker, check=check, actor=actor, reason=reason,
                          idempotency_key=idempotency_key)


def worker_drain(*, worker: Worker, actor, reason: str = "",
                 idempotency_key: str | None = None) -> Action:
    """Ask for a worker to be drained and stopped. 400 for a gateway; 409 unless it is starting or ready."""
    def check(locked: Worker) -> None:
        if locked.role == WorkerRole.GATEWAY:
            raise invalid("a gateway cannot be drained: it follows its deployment", field="worker")
        if locked.status not in (WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.READY):
            raise conflict(f"worker {locked.pk} is {locked.status}; only a pending, starting or ready worker "
                           "can be drained")

    return _worker_action(ActionKind.DRAIN, worker=worker, check=check, actor=actor, reason=reason,
                          idempotency_key=idempotency_key)


def _worker_action(kind: str, *, worker: Worker, check, actor, reason: str, idempotency_key: str | None) -> Action:
    """Lock the worker, `check(locked)` (raises to refuse), record the pending action for reconcile."""
    actor = as_actor(actor)

    def write() -> Action:
        locked = _lock_worker(worker)
        check(locked)
        action = action_create(kind=kind, actor=actor, deployment=locked.deployment, worker=locked, reason=reason,
                               params={"worker": locked.pk, "role": locked.role, "status": locked.status},
                               idempotency_key=idempotency_key)
        enqueue_reconcile(locked.deployment_id)
        return action

    return action_once(kind=kind, idempotency_key=idempotency_key, write=write, request={"worker": worker.pk})
