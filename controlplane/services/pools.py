"""Scaling a pool: the one write that operators, alert rules and (issue 4) the autoscaler all make."""
from __future__ import annotations

from django.db import transaction

from controlplane.errors import conflict, invalid
from controlplane.models import Action, ActionKind, Deployment, Pool
from controlplane.selectors import deployment_delete_pending
from controlplane.services.actions import DuplicateAction, action_create, action_find, as_actor, enqueue_reconcile


def pool_scale(*, deployment: Deployment, role: str, replicas: int, actor, reason: str = "",
               idempotency_key: str | None = None) -> Action:
    """Set the desired replicas of the deployment's `role` pool; reconcile starts or stops workers.

    400 for a role the deployment has no pool for or replicas outside min..max (the message says the bounds);
    409 while the deployment is being deleted. An action with the same idempotency key is returned unchanged.
    Returns the `scale` Action (params: role, from, to).
    """
    actor = as_actor(actor)
    existing = action_find(idempotency_key, kind=ActionKind.SCALE)
    if existing is not None:
        return existing
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise invalid(f"replicas must be an integer, not {replicas!r}", field="replicas")
    try:
        with transaction.atomic():
            deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
            if deployment_delete_pending(deployment) is not None:
                raise conflict(f"deployment {deployment.name!r} is being deleted")
            pool = Pool.objects.select_for_update().filter(deployment=deployment, role=role).first()
            if pool is None:
                roles = list(deployment.pools.order_by("role").values_list("role", flat=True))
                raise invalid(f"deployment {deployment.name!r} has no {role!r} pool (its pools: {roles})",
                              field="role")
            if not pool.min_replicas <= replicas <= pool.max_replicas:
                raise invalid(
                    f"replicas for {role} must be between {pool.min_replicas} and {pool.max_replicas} (min..max), "
                    f"not {replicas}", field="replicas", min_replicas=pool.min_replicas,
                    max_replicas=pool.max_replicas)
            previous = pool.desired_replicas
            action = action_create(kind=ActionKind.SCALE, actor=actor, deployment=deployment, reason=reason,
                                   params={"role": role, "from": previous, "to": replicas},
                                   idempotency_key=idempotency_key)
            pool.desired_replicas = replicas
            pool.save(update_fields=["desired_replicas"])
            enqueue_reconcile(deployment.pk)
    except DuplicateAction as dup:
        return dup.action
    return action
