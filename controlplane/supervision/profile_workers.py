"""Workers of a capacity profile run (WorkerPurpose.PROFILE): started and stopped by the node agent of the node
they are placed on, exactly as a pool's workers are, so that they show on the node, are health-checked, are stopped
with their deployment, and outlive no agent unseen. They belong to no pool: reconcile, the autoscaler and placement
never count them, and the gateway's membership and the scrape leave them out.

The profile run (controlplane.capacity.services.profile_jobs) picks the node, asks for the workers here, drives
them over HTTP and stops them here at its end, whatever happened.
"""
from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from controlplane.models import Deployment, Node, Revision, Worker, WorkerPurpose, WorkerStatus
from controlplane.supervision import node_queue
from controlplane.supervision.reconcile import START_RESEND_S


def profile_worker_start(*, deployment: Deployment, revision: Revision, role: str, node: Node) -> Worker:
    """A pending profile worker of `role` on `node`, handed to the node's agent once committed. Its start is
    claimed for START_RESEND_S as reconcile claims one, so that a lost message is sent again by reconcile (and
    started by the agent's own heartbeat once due)."""
    with transaction.atomic():
        worker = Worker.objects.create(
            deployment=deployment, pool=None, role=role, revision=revision, node=node, host=node.address,
            purpose=WorkerPurpose.PROFILE, status=WorkerStatus.PENDING,
            next_restart_at=timezone.now() + timedelta(seconds=START_RESEND_S))
        node_queue.send_start(worker)
    return worker


def profile_workers_stop(*, worker_ids: list[int] | None = None, deployment: Deployment | None = None,
                         reason: str) -> list[int]:
    """Stop profile workers (these ids, or every live one of `deployment`): a pending one at once, a starting or
    ready one through its agent (draining, then stopped). Returns the ids sent a stop or stopped."""
    rows = Worker.objects.filter(purpose=WorkerPurpose.PROFILE)
    if worker_ids is not None:
        rows = rows.filter(id__in=list(worker_ids))
    if deployment is not None:
        rows = rows.filter(deployment=deployment)
    now, done = timezone.now(), []
    with transaction.atomic():
        for worker in rows.filter(status__in=(WorkerStatus.PENDING, WorkerStatus.FAILED)).select_related("node"):
            # A stale process of a previous life (pid set) is its node heartbeat's to stop, as for any worker.
            if Worker.objects.filter(id=worker.id, status=worker.status).update(
                    status=WorkerStatus.STOPPED, stopped_at=now, next_restart_at=None, last_error=reason):
                done.append(worker.id)
        for worker in rows.filter(status__in=(WorkerStatus.STARTING, WorkerStatus.READY)).select_related("node"):
            if Worker.objects.filter(id=worker.id, status=worker.status).update(
                    status=WorkerStatus.DRAINING, last_error=reason):
                node_queue.send_stop(worker)
                done.append(worker.id)
    return done
