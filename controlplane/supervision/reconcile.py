"""Reconcile one deployment: make its workers match the desired state, and finish the actions that depend on it.

One pass, under a lock on the deployment row (PostgreSQL: SELECT ... FOR UPDATE; SQLite: the IMMEDIATE transaction
holds the write lock), so that two reconcilers never both create the missing worker:

1. A `delete` action pending or running: drain every worker; once none runs, delete the deployment row.
2. Operator actions on workers (restart, drain) that are pending: claim and carry them out. A ready worker of
   the current revision is replaced by a surge (a new worker that `replaces` it starts first; the old one drains
   once it is ready), so an operator's restart or drain never leaves the pool short; any other is restarted in
   place or drained at once.
3. Each pool: current-revision workers (pending, starting, ready, and failed ones, which keep their slot until an
   operator restarts them; a worker being replaced gives its slot to its replacement) vs desired replicas: create
   the missing, drain the excess (newest, least ready first). A replaced worker is drained once its replacement
   is ready.
4. Rollout: while a canary or A/B rollout is active, each pool also keeps `tried_replicas` workers of the tried
   revision beside the current ones (read through controlplane.rollout_provider, which the rollouts app fills in).
   Workers of any other revision are drained once every pool has its desired number of ready current-revision
   workers (the new group is complete, so the gateway switches to it); those that do not serve (pending,
   starting) are drained at once.
5. Exactly one gateway worker.
6. Finish the actions whose outcome is now known (create, rollback/revision, scale, drain).
7. Hand every due pending worker to its node agent.

Agent tasks are sent with transaction.on_commit: the agent must see the rows this pass wrote.
"""
from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from controlplane.models import (
    Action, ActionKind, ActionStatus, Deployment, Pool, Worker, WorkerRole, WorkerStatus,
)
from controlplane.rollout_provider import rollout_active, tried_replicas
from controlplane.services.actions import action_fail, action_start, action_succeed
from controlplane.services.deployments import deployment_remove
from controlplane.services.pools import pool_schedulable_set
from controlplane.services.restarts import worker_back_to_pending
from controlplane.supervision import node_queue
from controlplane.supervision.placement import node_pick, online_nodes, placement_for

log = logging.getLogger(__name__)

UNFINISHED = (ActionStatus.PENDING, ActionStatus.RUNNING)
SERVING = (WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.READY)
# How long a handed-over start may stay unanswered before it is sent again (a message lost with its broker).
START_RESEND_S = 30


def reconcile_deployment(deployment_id: int, *, skip_locked: bool = False) -> dict:
    """One reconcile pass (numbered steps in the module docstring). Returns a summary for logs and tests.
    skip_locked: do nothing if another reconcile holds the deployment's row (the periodic pass, which would
    otherwise queue behind a reconcile that is doing the same work)."""
    summary: dict = {"created": [], "drained": [], "started": [], "deleted": False}
    with transaction.atomic():
        deployment = (Deployment.objects.select_for_update(of=("self",), skip_locked=skip_locked)
                      .select_related("current_revision").filter(id=deployment_id).first())
        if deployment is None:
            return summary
        delete_action = (Action.objects.filter(deployment=deployment, kind=ActionKind.DELETE, status__in=UNFINISHED)
                         .order_by("created_at").first())
        if delete_action is not None:
            summary["deleted"] = _reconcile_delete(deployment, delete_action, summary)
            return summary
        _carry_out_worker_actions(deployment, summary)
        if deployment.current_revision is not None:
            pools = list(deployment.pools.all())
            rollout = rollout_active(deployment)
            for pool in pools:
                _reconcile_pool(deployment, pool, summary)
                if rollout is not None:
                    _reconcile_tried(deployment, pool, rollout, summary)
            _advance_replacements(deployment, summary)
            _advance_rollout(deployment, pools, summary, keep=rollout.revision_id if rollout else None)
        _reconcile_gateway(deployment, summary)
        _finish_actions(deployment)
        send_due_starts(Worker.objects.filter(deployment=deployment), summary)
    return summary


def drain_worker(worker: Worker, reason: str, summary: dict) -> None:
    """Take a worker out of service. A pending one has no process: it is stopped at once."""
    now = timezone.now()
    if worker.status == WorkerStatus.PENDING and Worker.objects.filter(
            id=worker.id, status=WorkerStatus.PENDING).update(
            status=WorkerStatus.STOPPED, stopped_at=now, last_error=reason, next_restart_at=None):
        # A stale process of a previous life (pid set) is the heartbeat's to stop.
        summary["drained"].append(worker.id)
        return
    if worker.status == WorkerStatus.FAILED and Worker.objects.filter(
            id=worker.id, status=WorkerStatus.FAILED).update(status=WorkerStatus.STOPPED, stopped_at=now):
        summary["drained"].append(worker.id)
        return
    if Worker.objects.filter(id=worker.id, status__in=(WorkerStatus.STARTING, WorkerStatus.READY)).update(
            status=WorkerStatus.DRAINING, last_error=reason):
        summary["drained"].append(worker.id)
        node_queue.send_stop(worker)


def _new_worker(deployment: Deployment, *, role: str, pool: Pool | None, summary: dict, **fields) -> Worker | None:
    """A pending worker on the node placement picks; None (logged, and said on the pool) when none qualifies."""
    node = fields.pop("node", None)
    if node is None and pool is not None:
        placement = placement_for(pool)
        node = placement.node
        if node is None:
            summary.setdefault("unschedulable", {})[pool.role] = placement.reason
            return None
    node = node or node_pick()
    if node is None:
        log.warning("deployment %s: no online node for a %s worker; retrying on the next pass", deployment.name, role)
        return None
    worker = Worker.objects.create(deployment=deployment, pool=pool, role=role, node=node, host=node.address,
                                   status=WorkerStatus.PENDING, **fields)
    summary["created"].append(worker.id)
    return worker


def _being_replaced(pool: Pool) -> set[int]:
    """Workers whose surge replacement is on its way or serving: their slot is the replacement's."""
    return set(Worker.objects.filter(pool=pool, replaces__isnull=False, status__in=SERVING)
               .values_list("replaces_id", flat=True))


def _reconcile_pool(deployment: Deployment, pool: Pool, summary: dict) -> None:
    current = deployment.current_revision
    replaced = _being_replaced(pool)
    slots = [w for w in Worker.objects.filter(pool=pool, revision=current,
                                              status__in=(*SERVING, WorkerStatus.FAILED)).order_by("id")
             if w.id not in replaced]
    missing = pool.desired_replicas - len(slots)
    placed_all = all(_new_worker(deployment, role=pool.role, pool=pool, revision=current, summary=summary)
                     is not None for _ in range(max(0, missing)))  # stops at the first that finds no node
    if not placed_all:
        num_placed = (Worker.objects.filter(pool=pool, revision=current, status__in=(*SERVING, WorkerStatus.FAILED))
                      .exclude(id__in=replaced).count())
        num_unplaced = pool.desired_replicas - num_placed
        pool_schedulable_set(pool=pool, num_unplaced=num_unplaced, reason=(
            f"{num_unplaced} of {pool.desired_replicas} workers cannot be placed: "
            f"{summary['unschedulable'][pool.role]}"))
    elif pool.unschedulable_reason:
        pool_schedulable_set(pool=pool, num_unplaced=0, reason="")
    if missing < 0:
        # Failed first (they serve nothing), then the least ready, newest first: ready old-timers keep serving.
        rank = {WorkerStatus.FAILED: 0, WorkerStatus.PENDING: 1, WorkerStatus.STARTING: 2, WorkerStatus.READY: 3}
        excess = sorted(slots, key=lambda w: (rank[w.status], -w.id))[:-missing]
        for worker in excess:
            drain_worker(worker, f"scaled {pool.role} down to {pool.desired_replicas}", summary)


def _reconcile_tried(deployment: Deployment, pool: Pool, rollout, summary: dict) -> None:
    """The tried revision's workers of one pool during a canary or A/B rollout: its `tried_replicas`, created or
    drained like the current revision's (the excess least ready and newest first)."""
    wanted = tried_replicas(pool, rollout)
    slots = list(Worker.objects.filter(pool=pool, revision=rollout.revision,
                                       status__in=(*SERVING, WorkerStatus.FAILED)).order_by("id"))
    for _ in range(wanted - len(slots)):
        if _new_worker(deployment, role=pool.role, pool=pool, revision=rollout.revision, summary=summary) is None:
            break
    if len(slots) > wanted:
        rank = {WorkerStatus.FAILED: 0, WorkerStatus.PENDING: 1, WorkerStatus.STARTING: 2, WorkerStatus.READY: 3}
        for worker in sorted(slots, key=lambda w: (rank[w.status], -w.id))[:len(slots) - wanted]:
            drain_worker(worker, f"rollout {rollout.pk} needs {wanted} {pool.role} workers", summary)


def _advance_replacements(deployment: Deployment, summary: dict) -> None:
    """Drain each worker whose surge replacement is ready."""
    ready = Worker.objects.filter(deployment=deployment, replaces__isnull=False, status=WorkerStatus.READY,
                                  replaces__status__in=SERVING).select_related("replaces")
    for replacement in ready:
        drain_worker(replacement.replaces, f"replaced by worker {replacement.id}", summary)


def _advance_rollout(deployment: Deployment, pools: list[Pool], summary: dict, *, keep: int | None) -> None:
    """Drain the workers of revisions other than the current one (and `keep`, an active rollout's tried one)."""
    current = deployment.current_revision
    others = Worker.objects.filter(deployment=deployment, pool__isnull=False, status__in=SERVING).exclude(
        revision=current)
    old = list(others.exclude(revision_id=keep) if keep is not None else others)
    if not old:
        return
    new_group_complete = all(
        Worker.objects.filter(pool=pool, revision=current, status=WorkerStatus.READY).count() >= pool.desired_replicas
        for pool in pools
    )
    for worker in old:
        if new_group_complete or worker.status != WorkerStatus.READY:
            drain_worker(worker, f"rollout to revision {current.number}", summary)


def _reconcile_gateway(deployment: Deployment, summary: dict) -> None:
    if deployment.gateway_port is None:
        # Attached to a shared gateway (services.gateways): a gateway of its own that still runs stops.
        for own in Worker.objects.filter(deployment=deployment, role=WorkerRole.GATEWAY, status__in=SERVING):
            drain_worker(own, "served by a shared gateway", summary)
        return
    gateways = list(Worker.objects.filter(deployment=deployment, role=WorkerRole.GATEWAY,
                                          status__in=(*SERVING, WorkerStatus.FAILED)).order_by("id"))
    if not gateways:
        _new_worker(deployment, role=WorkerRole.GATEWAY, pool=None, summary=summary, port=deployment.gateway_port,
                    node=deployment.gateway_node if deployment.gateway_node_id else None)
    for extra in gateways[1:]:
        drain_worker(extra, "one gateway per deployment", summary)


def _carry_out_worker_actions(deployment: Deployment, summary: dict) -> None:
    """Operator restart and drain actions (worker_restart / worker_drain services leave them pending)."""
    pending = Action.objects.filter(deployment=deployment, status=ActionStatus.PENDING, worker__isnull=False,
                                    kind__in=(ActionKind.RESTART, ActionKind.DRAIN)).select_related("worker")
    for action in pending:
        worker = action.worker
        by = f"{action.kind} requested by {action.actor}: {action.reason}".strip(": ")
        if _surges(deployment, worker) and _new_worker(deployment, role=worker.role, pool=worker.pool,
                                                       revision=worker.revision, replaces=worker, last_error=by,
                                                       summary=summary) is not None:
            # The replacement starts first; _advance_replacements drains this one once it is ready.
            action_start(action_id=action.id)
            continue
        # Not surging (not a ready current worker), or no room beside it for a replacement (a GPU per worker on a
        # full node): carried out in place.
        if not action_start(action_id=action.id):
            continue
        if action.kind == ActionKind.DRAIN:
            if worker.status in (WorkerStatus.STOPPED, WorkerStatus.DRAINING):
                if worker.status == WorkerStatus.STOPPED:
                    action_succeed(action_id=action.id, result={"worker_status": worker.status})
                continue
            drain_worker(worker, by, summary)
            continue
        # restart in place, like a supervised restart but without backoff; a failed worker gets its slot back.
        if worker.status not in (WorkerStatus.STARTING, WorkerStatus.READY, WorkerStatus.FAILED,
                                 WorkerStatus.PENDING):
            action_fail(action_id=action.id, error=f"worker {worker.id} is {worker.status}: nothing to restart")
            continue
        worker_back_to_pending(worker=worker, from_status=worker.status, reason=by)


def _surges(deployment: Deployment, worker: Worker) -> bool:
    """Whether an operator's restart or drain of `worker` starts a replacement first: a ready pool worker of the
    current revision (a gateway owns its port; a worker of an older revision goes with its rollout)."""
    return (worker.status == WorkerStatus.READY and worker.pool_id is not None
            and worker.revision_id == deployment.current_revision_id)


def _finish_actions(deployment: Deployment) -> None:
    current = deployment.current_revision
    # A create finishes like a rollout: once every pool has its ready workers of the (first) revision.
    for action in Action.objects.filter(deployment=deployment, status__in=UNFINISHED,
                                        kind__in=(ActionKind.CREATE, ActionKind.ROLLBACK, ActionKind.REVISION,
                                                  ActionKind.PROMOTE)):
        if action.status == ActionStatus.PENDING:
            action_start(action_id=action.id)
        failed = Worker.objects.filter(deployment=deployment, revision=current, status=WorkerStatus.FAILED,
                                       stopped_at__gte=action.created_at).first()
        if failed is not None:
            action_fail(action_id=action.id, error=(
                f"{failed.role} worker {failed.id} of revision {current.number} failed: {failed.last_error}"[:2000]),
                result={"revision": current.number})
            continue
        others_left = Worker.objects.filter(deployment=deployment, pool__isnull=False).exclude(
            revision=current).exclude(status__in=(WorkerStatus.STOPPED, WorkerStatus.FAILED)).exists()
        all_ready = all(
            Worker.objects.filter(pool=pool, revision=current, status=WorkerStatus.READY).count()
            >= pool.desired_replicas for pool in deployment.pools.all())
        if not others_left and all_ready:
            action_succeed(action_id=action.id, result={"revision": current.number})
    _finish_scale_actions(deployment)
    for action in Action.objects.filter(deployment=deployment, status=ActionStatus.RUNNING,
                                        kind__in=(ActionKind.DRAIN, ActionKind.RESTART),
                                        worker__isnull=False).select_related("worker"):
        replacement = (Worker.objects.filter(replaces=action.worker, created_at__gte=action.created_at)
                       .order_by("-id").first())
        if (replacement is not None and replacement.status in (WorkerStatus.FAILED, WorkerStatus.STOPPED)
                and action.worker.status in SERVING):
            # The replacement gave up (and its slot went back to the worker it was to replace, which serves on).
            action_fail(action_id=action.id, error=f"its replacement, worker {replacement.id}, did not become "
                                                   f"ready: {replacement.last_error}"[:2000])
        elif action.worker.status in (WorkerStatus.STOPPED, WorkerStatus.FAILED) and (
                action.kind == ActionKind.DRAIN or replacement is not None):
            result = {"worker_status": action.worker.status}
            if replacement is not None:
                result["replacement"] = replacement.id
            action_succeed(action_id=action.id, result=result)


def _finish_scale_actions(deployment: Deployment) -> None:
    """A scale action succeeds once its pool has exactly the desired ready workers and nothing starting or
    draining; a later scale of the same pool supersedes it; a worker of the pool that failed since fails it."""
    current = deployment.current_revision
    pools = {pool.role: pool for pool in deployment.pools.all()}
    actions = list(Action.objects.filter(deployment=deployment, status__in=UNFINISHED, kind=ActionKind.SCALE)
                   .order_by("id"))
    for action in actions:
        if action.status == ActionStatus.PENDING:
            action_start(action_id=action.id)
        role = (action.params or {}).get("role")
        pool = pools.get(role)
        if pool is None:
            action_fail(action_id=action.id, error=f"the deployment has no {role!r} pool")
            continue
        later = [a.id for a in actions if a.id > action.id and (a.params or {}).get("role") == role]
        if later:
            action_succeed(action_id=action.id, result={"superseded_by": later[-1]})
            continue
        workers = Worker.objects.filter(pool=pool)
        failed = workers.filter(status=WorkerStatus.FAILED, stopped_at__gte=action.created_at).first()
        if failed is not None:
            action_fail(action_id=action.id, error=f"{role} worker {failed.id} failed: {failed.last_error}"[:2000])
            continue
        num_ready = workers.filter(revision=current, status=WorkerStatus.READY).count()
        busy = workers.filter(status__in=(WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.DRAINING))
        if num_ready == pool.desired_replicas and not busy.exists():
            action_succeed(action_id=action.id, result={"role": role, "num_ready": num_ready})


def send_due_starts(owned: QuerySet[Worker], summary: dict) -> None:
    """Hand the due pending workers among `owned` (one deployment's, or one shared gateway's) to their agents. The
    claim (next_restart_at moved START_RESEND_S ahead) keeps two passes from sending the same start twice, and
    resends it if the agent never picked it up."""
    now = timezone.now()
    online_ids = set(online_nodes().values_list("id", flat=True))
    due = owned.filter(status=WorkerStatus.PENDING).select_related("node")
    for worker in due:
        if worker.next_restart_at is not None and worker.next_restart_at > now:
            continue
        if worker.node_id not in online_ids:
            node = (placement_for(worker.pool, exclude_worker=worker.id).node if worker.pool_id is not None
                    else node_pick())
            if node is None or (worker.pid is not None):
                continue  # no node for it; or a stale process that only its own node can stop
            Worker.objects.filter(id=worker.id, status=WorkerStatus.PENDING).update(node=node)
            worker.node = node
        num_claimed = Worker.objects.filter(id=worker.id, status=WorkerStatus.PENDING,
                                            next_restart_at=worker.next_restart_at).update(
            next_restart_at=now + timedelta(seconds=START_RESEND_S))
        if num_claimed == 1:
            summary["started"].append(worker.id)
            node_queue.send_start(worker)


def _reconcile_delete(deployment: Deployment, action: Action, summary: dict) -> bool:
    """Drain everything; when no process is left, delete the deployment (its rows cascade; the log stays)."""
    if action.status == ActionStatus.PENDING:
        action_start(action_id=action.id)
    # Operator actions on its workers can no longer be carried out.
    for pending in Action.objects.filter(deployment=deployment, status__in=UNFINISHED).exclude(id=action.id):
        action_fail(action_id=pending.id, error="the deployment was deleted")
    running = Worker.objects.filter(deployment=deployment).exclude(
        status__in=(WorkerStatus.STOPPED, WorkerStatus.FAILED))
    for worker in running:
        if worker.status != WorkerStatus.DRAINING:
            drain_worker(worker, "deployment deleted", summary)
    if running.exists():
        return False
    name = deployment.name
    action_succeed(action_id=action.id, result={"deployment": name})
    deployment_remove(deployment=deployment)
    log.info("deployment %s deleted: every process stopped", name)
    return True
