"""Shared gateways (docs/gateway.md, "Shared gateway"): creating and deleting one, and attaching a deployment to one
or detaching it. Each write is desired state only: reconcile stops a deployment's own gateway once it is attached
(its port given back) and starts one again once it is detached."""
from __future__ import annotations

from django.conf import settings
from django.db import IntegrityError, transaction

from controlplane.errors import conflict, invalid
from controlplane.models import Deployment, Node, SharedGateway
from controlplane.services.actions import enqueue_reconcile
from controlplane.services.deployments import gateway_port_pick
from controlplane.services.validation import validate_name, validate_port


def shared_gateway_create(*, name, port, node: str | None = None, actor=None) -> SharedGateway:
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
    try:
        with transaction.atomic():
            return SharedGateway.objects.create(name=name, port=port, node=node_row,
                                                created_by=actor if getattr(actor, "pk", None) else None)
    except IntegrityError:
        raise conflict(f"a shared gateway named {name!r} or on port {port} exists already") from None


def shared_gateway_delete(*, gateway: SharedGateway) -> None:
    """409 while it serves a deployment: detach them first (each then gets a gateway of its own again)."""
    with transaction.atomic():
        names = list(Deployment.objects.filter(shared_gateway=gateway).values_list("name", flat=True))
        if names:
            raise conflict(f"shared gateway {gateway.name!r} serves {', '.join(sorted(names))}: detach them first",
                           field="deployments")
        SharedGateway.objects.filter(pk=gateway.pk).delete()


def deployment_gateway_attach(*, deployment: Deployment, gateway: SharedGateway) -> Deployment:
    """Serve `deployment` from `gateway`: its own gateway (if it has one) stops at the next reconcile, and its port is
    free for another. Attaching it to the gateway that serves it already changes nothing."""
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(shared_gateway=gateway, gateway_port=None)
        enqueue_reconcile(deployment.pk)
    deployment.refresh_from_db()
    return deployment


def deployment_gateway_detach(*, deployment: Deployment) -> Deployment:
    """Give `deployment` a gateway of its own again (the first free port, as at create); 409 when it has one."""
    if deployment.shared_gateway_id is None:
        raise conflict(f"deployment {deployment.name!r} is not served by a shared gateway", field="shared_gateway")
    with transaction.atomic():
        Deployment.objects.filter(pk=deployment.pk).update(shared_gateway=None, gateway_port=gateway_port_pick())
        enqueue_reconcile(deployment.pk)
    deployment.refresh_from_db()
    return deployment
