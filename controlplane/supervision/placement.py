"""Where a new worker goes.

A pool's worker may run on an online node (agent seen recently) whose labels include the pool's node selector and
that has room for the pool's per-worker request: `gpus_per_worker` GPUs not taken by other workers (unless the pool
allows sharing, when the node only needs that many GPUs) and `threads_per_worker` CPU threads within the node's
`cpu.count`. Among those, the pool's workers spread: the node with the fewest workers of this pool, then the fewest
live workers, then by name. When no node qualifies the answer says why, in the words an operator acts on
("no online node matches class=bandwidth with 1 free GPU"). A gateway (no pool) goes to the least loaded node.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from controlplane.models import Node, Pool, Worker, WorkerStatus

ACTIVE_STATUSES = (WorkerStatus.PENDING, WorkerStatus.STARTING, WorkerStatus.READY, WorkerStatus.DRAINING)


def online_nodes():
    since = timezone.now() - timedelta(seconds=settings.TANDEM_NODE_OFFLINE_AFTER_S)
    return Node.objects.filter(last_seen_at__gte=since)


def node_pick() -> Node | None:
    """The least loaded online node, or None when no agent is up (the worker is then created on a later pass)."""
    return (online_nodes()
            .annotate(num_live=Count("workers", filter=Q(workers__status__in=ACTIVE_STATUSES)))
            .order_by("num_live", "name")
            .first())


@dataclass(frozen=True, slots=True)
class Placement:
    node: Node | None
    reason: str = ""  # why there is no node ("" when there is one)


def selector_text(selector: dict) -> str:
    return ",".join(f"{key}={value}" for key, value in sorted(selector.items()))


def _used(node: Node, *, exclude_worker: int | None) -> tuple[int, int]:
    """GPUs and CPU threads that the live workers on `node` hold by their pools' requests."""
    live = (Worker.objects.filter(node=node, status__in=ACTIVE_STATUSES, pool__isnull=False)
            .exclude(id=exclude_worker).values_list("pool__gpus_per_worker", "pool__allow_gpu_sharing",
                                                    "pool__threads_per_worker"))
    gpus = sum(num_gpus for num_gpus, sharing, _ in live if not sharing)
    threads = sum(num_threads for _, _, num_threads in live)
    return gpus, threads


def _shortfall(node: Node, pool: Pool, *, exclude_worker: int | None) -> str:
    """What `node` lacks for one more worker of `pool` ("" when it has room)."""
    used_gpus, used_threads = _used(node, exclude_worker=exclude_worker)
    if pool.gpus_per_worker:
        free = node.num_gpus if pool.allow_gpu_sharing else node.num_gpus - used_gpus
        if free < pool.gpus_per_worker:
            return f"{pool.gpus_per_worker} free GPU{'s' if pool.gpus_per_worker > 1 else ''}"
    if pool.threads_per_worker and node.num_cpus is not None:
        if node.num_cpus - used_threads < pool.threads_per_worker:
            return f"{pool.threads_per_worker} free CPU thread{'s' if pool.threads_per_worker > 1 else ''}"
    return ""


def placement_for(pool: Pool, *, exclude_worker: int | None = None) -> Placement:
    """The node for one more worker of `pool` (exclude_worker: a worker being moved, whose own hold is not counted),
    or no node and the reason."""
    selector = pool.node_selector or {}
    nodes = list(online_nodes().annotate(
        num_live=Count("workers", filter=Q(workers__status__in=ACTIVE_STATUSES)),
        num_of_pool=Count("workers", filter=Q(workers__status__in=ACTIVE_STATUSES, workers__pool=pool))))
    what = f"matches {selector_text(selector)}" if selector else "is up"
    matching = [node for node in nodes if node.matches(selector)]
    if not matching:
        return Placement(None, f"no online node {what}" if nodes else "no node agent is online")
    fitting, lacks = [], set()
    for node in matching:
        shortfall = _shortfall(node, pool, exclude_worker=exclude_worker)
        if shortfall:
            lacks.add(shortfall)
        else:
            fitting.append(node)
    if not fitting:
        return Placement(None, f"no online node {what} with {' and '.join(sorted(lacks))}")
    return Placement(min(fitting, key=lambda node: (node.num_of_pool, node.num_live, node.name)))
