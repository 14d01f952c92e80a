"""Shared gateways (docs/gateway.md, "Shared gateway"): creating and deleting one, and attaching a deployment to one
or detaching it, each with a `gateway` action row (params.event says which). Each write is desired state only:
reconcile stops a deployment's own gateway once it is attached (its port given back) and starts one again once it
is detached; the shared gateway's own reconcile (supervision.shared_gateways) runs its process while it serves a
deployment, and restarts it for the worker key of one attached since it started."""
from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, transaction

from controlplane.errors import conflict, invalid
from controlplane.models import ActionKind, ActionStatus, Deployment, Node, SharedGateway, Worker
from controlplane.models.workers import LIVE_STATUSES
from controlplane.services.actions import (action_create, as_actor, enqueue_reconcile,
                                           enqueue_shared_gateway_reconcile)
from controlplane.services.deployments import gateway_port_pick
from controlplane.services.validation import validate_name, validate_port


def shared_gateway_create(*, name, port, node: str | None = None, actor) -> SharedGateway:
    """A shared gateway named `name` on `port` (on `node`, else the control plane's host). 400 naming the field for
    a bad name, port or node; 409 for a name or port taken (by another shared gateway or a deployment's own)."""
    validate_name(name)
    validate_port(port, field="port")
    if port == settings.TANDEM_WEB_PORT:
        raise invalid(f"port {port} is the web port", field="port")
    node_row = None
    if node is not None:
        node_row = Node.objects.filter(name=node).first() if isinstance(node, str) else None
        if node_row is None:
            raise invalid(f"node {node!r} does not exist", field="node")
    if Deployment.objects.filter(gateway_port=port).exists():
        raise conflict(f"port {port} is a deployment's gateway port", field="port")
    actor = as_actor(actor)
    try:
        with transaction.atomic():
            gateway = SharedGateway.objects.create(name=name, port=port, node=node_row, created_by=actor.user)
            _record(actor, "create", gateway)
            return gateway
    except IntegrityError:
        raise conflict(f"a shared gateway named {name!r} or on port {port} exists already") from None


def shared_gateway_delete(*, gateway: SharedGateway, actor) -> None:
    """409 while it serves a deployment (detach them first: each then gets a gateway of its own again), and while
    its process still runs (it stops once it serves none: a moment after the last detach)."""
    with transaction.atomic():
        names = list(Deployment.objects.filter(shared_gateway=gateway).values_list("name", flat=True))
        if names:
            raise conflict(f"shared gateway {gateway.name!r} serves {', '.join(sorted(names))}: detach them first",
                           field="deployments")
        if Worker.objects.filter(shared_gateway=gateway, status__in=LIVE_STATUSES).exists():
            # Its row goes with the gateway's: deleted now, the process it stands for would run on unsupervised.
            enqueue_shared_gateway_reconcile(gateway.pk)
            raise conflict(f"shared gateway {gateway.name!r} is still stopping its process: try again in a moment",
                           field="name")
        _record(as_actor(actor), "delete", gateway)
        SharedGateway.objects.filter(pk=gateway.pk).delete()


def deployment_gateway_attach(*, deployment: Deployment, gateway: SharedGateway, actor) -> Deployment:
    """Serve `deployment` from `gateway`: its own gateway (if it has one) stops at the next reconcile, and its port is
    free for another. Attaching it to the gateway that serves it already changes nothing."""
    with transaction.atomic():
        if deployment.shared_gateway_id != gateway.pk:
            Deployment.objects.filter(pk=deployment.pk).update(shared_gateway=gateway, gateway_port=None)
            _record(as_actor(actor), "attach", gateway, deployment=deployment)
        enqueue_reconcile(deployment.pk)
        enqueue_shared_gateway_reconcile(gateway.pk)
    deployment.refresh_from_db()
    return deployment


def deployment_gateway_detach(*, deployment: Deployment, actor) -> Deployment:
    """Give `deployment` a gateway of its own again (the first free port, as at create); 409 when it has one."""
    gateway = deployment.shared_gateway
    if gateway is None:
        raise conflict(f"deployment {deployment.name!r} is not served by a shared gateway", field="shared_gateway")
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(shared_gateway=None, gateway_port=gateway_port_pick())
        _record(as_actor(actor), "detach", gateway, deployment=deployment)
        enqueue_reconcile(deployment.pk)
        enqueue_shared_gateway_reconcile(gateway.pk)
    deployment.refresh_from_db()
    return deployment


def _record(actor, event: str, gateway: SharedGateway, deployment: Deployment | None = None) -> None:
    action_create(kind=ActionKind.GATEWAY, actor=actor, deployment=deployment, status=ActionStatus.SUCCEEDED,
                  params={"event": event, "shared_gateway": gateway.name, "port": gateway.port})
