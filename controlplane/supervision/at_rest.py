"""Which deployments a reconcile pass can leave alone: those at rest, where reconcile_deployment would find nothing to
do. Read for every deployment in a handful of queries, where a reconcile of each costs some twenty (at fifty
deployments, most of a pass).

At rest means every condition under which reconcile acts is absent:
- a current revision, and no unfinished action (create, scale, restart, drain, rollback, delete...);
- no worker pending, starting or draining (starts to hand over, drains to finish);
- no ready surge replacement whose replaced worker still serves;
- every pool holds exactly its desired replicas of the current revision (ready, or failed: a failed worker keeps its
  slot), says it is schedulable, and no worker of another revision serves in it;
- exactly one gateway where the deployment has a gateway port.
"""
from __future__ import annotations

from collections import Counter

from controlplane.models import Action, ActionStatus, Deployment, Pool, Worker, WorkerRole, WorkerStatus

_UNSETTLED = (WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.DRAINING)
_HOLDING = (WorkerStatus.READY, WorkerStatus.FAILED)


def deployments_at_rest(deployment_ids: list[int]) -> set[int]:
    deployments = {d: (revision, port) for d, revision, port in Deployment.objects.filter(
        id__in=deployment_ids).values_list("id", "current_revision_id", "gateway_port")}
    busy = set(Action.objects.filter(deployment_id__in=deployment_ids, status__in=(
        ActionStatus.PENDING, ActionStatus.RUNNING)).values_list("deployment_id", flat=True))
    busy |= set(Worker.objects.filter(deployment_id__in=deployment_ids, replaces__isnull=False,
                                      status=WorkerStatus.READY, replaces__status__in=(
                                          WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.READY))
                .values_list("deployment_id", flat=True))
    held: Counter = Counter()  # (deployment, pool) -> current-revision workers holding a slot
    gateways: Counter = Counter()
    for deployment_id, pool_id, role, status, revision_id in Worker.objects.filter(
            deployment_id__in=deployment_ids, status__in=(*_UNSETTLED, *_HOLDING)).values_list(
            "deployment_id", "pool_id", "role", "status", "revision_id"):
        if status in _UNSETTLED:
            busy.add(deployment_id)
        elif role == WorkerRole.GATEWAY:
            gateways[deployment_id] += 1
        elif revision_id != deployments.get(deployment_id, (None, None))[0]:
            busy.add(deployment_id)  # a rollout to finish
        else:
            held[(deployment_id, pool_id)] += 1
    for pool_id, deployment_id, desired, reason in Pool.objects.filter(deployment_id__in=deployment_ids).values_list(
            "id", "deployment_id", "desired_replicas", "unschedulable_reason"):
        if reason or held[(deployment_id, pool_id)] != desired:
            busy.add(deployment_id)
    at_rest = set()
    for deployment_id, (revision_id, gateway_port) in deployments.items():
        if deployment_id in busy or revision_id is None:
            continue
        if gateway_port is not None and gateways[deployment_id] != 1:
            continue
        at_rest.add(deployment_id)
    return at_rest
