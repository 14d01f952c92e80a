"""Node labels: what operators set on a node (a hardware class, a zone), which pools select nodes by."""
from __future__ import annotations

import re

from django.db import transaction

from controlplane.errors import invalid
from controlplane.models import ActionKind, ActionStatus, Node
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
