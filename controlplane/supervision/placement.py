"""Where a new worker goes: the online node (agent seen recently) with the fewest live workers."""
from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Q
from django.utils import timezone

from controlplane.models import Node, WorkerStatus

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
