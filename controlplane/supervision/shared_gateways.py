"""Reconcile one shared gateway (docs/gateway.md, "Shared gateway"): its process is a gateway Worker row of its own
(`Worker.shared_gateway`, no deployment), started, probed, restarted and re-adopted as a deployment's gateway is.

One pass, under a lock on the SharedGateway row:

1. No deployment attached: nothing to serve, so its process (if any) stops; `shared_gateway_delete` waits for that.
2. Exactly one gateway worker on the gateway's port (on its node, else the least loaded online node); extras drain.
3. A process started before a deployment was attached lacks that deployment's worker key (keys travel in its
   environment, never over the API): it is restarted in place, as an operator's restart would. Its deployments
   are refused for the moment it takes to come back; a detached deployment needs no restart (the membership no
   longer lists it, so the key it still holds is never sent).
4. Hand its due pending start to the node agent (reconcile.send_due_starts).
"""
from __future__ import annotations

import logging

from django.db import transaction

from controlplane.models import Deployment, SharedGateway, Worker, WorkerRole, WorkerStatus
from controlplane.services.restarts import worker_back_to_pending
from controlplane.supervision.placement import node_pick
from controlplane.supervision.reconcile import SERVING, drain_worker, send_due_starts

log = logging.getLogger(__name__)


def reconcile_shared_gateway(gateway_id: int) -> dict:
    """One pass (numbered steps in the module docstring). Returns a summary for logs and tests."""
    summary: dict = {"created": [], "drained": [], "started": [], "restarted": []}
    with transaction.atomic():
        gateway = (SharedGateway.objects.select_for_update(of=("self",)).select_related("node")
                   .filter(id=gateway_id).first())
        if gateway is None:
            return summary
        attached = set(Deployment.objects.filter(shared_gateway=gateway).values_list("id", flat=True))
        owned = Worker.objects.filter(shared_gateway=gateway, role=WorkerRole.GATEWAY)
        rows = list(owned.filter(status__in=(*SERVING, WorkerStatus.FAILED)).order_by("id"))
        if not attached:
            for worker in rows:
                drain_worker(worker, "serves no deployment", summary)
            return summary
        if not rows:
            node = gateway.node or node_pick()
            if node is None:
                log.warning("shared gateway %s: no online node for its process; retrying on the next pass",
                            gateway.name)
                return summary
            worker = Worker.objects.create(shared_gateway=gateway, role=WorkerRole.GATEWAY, node=node,
                                           host=node.address, port=gateway.port, status=WorkerStatus.PENDING)
            summary["created"].append(worker.id)
        for extra in rows[1:]:
            drain_worker(extra, "one process per shared gateway", summary)
        if rows and rows[0].status in (WorkerStatus.STARTING, WorkerStatus.READY) and rows[0].pid is not None:
            _restart_for_keys(rows[0], attached, summary)
        send_due_starts(owned, summary)
    return summary


def _restart_for_keys(worker: Worker, attached: set[int], summary: dict) -> None:
    """Step 3: restart the process in place when an attached deployment's worker key is not in its environment."""
    missing = attached - set(worker.worker_keys_of or [])
    if not missing:
        return
    names = ", ".join(sorted(Deployment.objects.filter(id__in=missing).values_list("name", flat=True)))
    if worker_back_to_pending(worker=worker, from_status=worker.status,
                              reason=f"restarted for the worker key of {names}, attached since it started"):
        summary["restarted"].append(worker.id)
