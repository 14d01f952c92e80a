"""Node labels: what operators set on a node (a hardware class, a zone), which pools select nodes by; and the
host's roofline, which its agent measures (controlplane.agent.host), at start or when an operator asks."""
from __future__ import annotations

import re

from django.db import transaction

from controlplane.errors import invalid
from controlplane.models import ActionKind, ActionStatus, Node
from controlplane.celery import task_send
from controlplane.services.actions import action_create, as_actor
from inference.weights import WEIGHT_LABEL, parse_weight

# Kubernetes' shape: an optional DNS-like prefix and a name; values short and plain.
LABEL_KEY = re.compile(r"[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?")
LABEL_VALUE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._ -]{0,61}[A-Za-z0-9])?")
MAX_LABELS = 32


def validate_labels(labels, *, field: str = "labels") -> dict[str, str]:
    """{"class": "compute"} → the same; 400 naming the first bad key or value."""
    if not isinstance(labels, dict):
        raise invalid(f"{field} must be an object of label → value", field=field)
    if len(labels) > MAX_LABELS:
        raise invalid(f"{field} takes at most {MAX_LABELS} labels", field=field)
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
            raise invalid(f"{field}: {key!r} is not a label name (lowercase letters, digits, '.', '_', '/', '-'; "
                          "at most 63)", field=f"{field}.{key}")
        if not isinstance(value, str) or not LABEL_VALUE.fullmatch(value):
            raise invalid(f"{field}.{key} must be a string of letters, digits, '.', '_', '-' or spaces (at most 63), "
                          f"not {value!r}", field=f"{field}.{key}")
        if key == WEIGHT_LABEL:
            # The gateway's weight for this node's workers (Pool.routing_weight): refused now rather than ignored.
            try:
                parse_weight(value)
            except ValueError as exc:
                raise invalid(f"{field}.{key} (a routing weight) {exc}", field=f"{field}.{key}") from None
    return dict(labels)


def node_labels_set(*, node: Node, labels: dict, actor, reason: str = "") -> Node:
    """Replace the labels operators set on `node` (detected labels stay); an audit row records old and new."""
    actor = as_actor(actor)
    labels = validate_labels(labels)
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        previous = dict(node.labels or {})
        if previous == labels:
            return node
        node.labels = labels
        node.save(update_fields=["labels"])
        action_create(kind=ActionKind.LABEL, actor=actor, reason=reason or f"labels of node {node.name}",
                      status=ActionStatus.SUCCEEDED, params={"node": node.name, "from": previous, "to": labels})
    return node


# The agent task's name (controlplane.agent.host.AGENT_MEASURE_HOST): sent by name, services do not import the agent.
AGENT_MEASURE_HOST = "controlplane.agent.tasks.agent_measure_host"


def node_roofline_set(*, node: Node, roofline: dict) -> None:
    """Store what the node's agent measured of its host (written by the agent only)."""
    Node.objects.filter(pk=node.pk).update(roofline=roofline)


def node_engines_set(*, node: Node, engines: dict) -> None:
    """Store which other engines the node's agent found on its host (written by the agent only), and label the node
    with each one's version (`engine.vllm`: "0.32.0"), so that a pool can select nodes that have it."""
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        labels = {key: value for key, value in (node.detected_labels or {}).items() if not key.startswith("engine.")}
        labels.update({f"engine.{name}": found["version"] for name, found in engines.items() if found.get("version")})
        node.engines, node.detected_labels = engines, labels
        node.save(update_fields=["engines", "detected_labels"])


def node_measure_request(*, node: Node) -> bool:
    """Ask the node's agent to measure its host again (a message on its queue, done when the agent takes it; the
    node's `roofline.measured_at` says when it was). Returns whether the broker took the message."""
    return task_send(AGENT_MEASURE_HOST, args=(node.name,), queue=node.queue)
