"""Scaling a pool: the one write that operators, alert rules, Alertmanager webhooks and the autoscaler all make,
to a number (pool_scale) or by a step clamped to min..max (pool_scale_by)."""
from __future__ import annotations


from controlplane.errors import ControlPlaneError, conflict, invalid
from controlplane.models import Action, ActionKind, ActionStatus, Deployment, Pool
from controlplane.selectors import deployment_delete_pending
from controlplane.services.actions import Actor, action_create, action_once, as_actor, enqueue_reconcile
from controlplane.services.nodes import validate_labels
from controlplane.services.validation import each_object
from inference.weights import weight_problem


def pool_scale(*, deployment: Deployment, role: str, replicas: int, actor, reason: str = "",
               idempotency_key: str | None = None) -> Action:
    """Set the desired replicas of the deployment's `role` pool; reconcile starts or stops workers.

    400 for a role the deployment has no pool for or replicas outside min..max (the message says the bounds);
    409 while the deployment is being deleted. An action with the same idempotency key is returned unchanged.
    Returns the `scale` Action (params: role, from, to).
    """
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        raise invalid(f"replicas must be an integer, not {replicas!r}", field="replicas")

    def check(pool: Pool) -> int:
        if not pool.min_replicas <= replicas <= pool.max_replicas:
            raise invalid(
                f"replicas for {role} must be between {pool.min_replicas} and {pool.max_replicas} (min..max), "
                f"not {replicas}", field="replicas", min_replicas=pool.min_replicas, max_replicas=pool.max_replicas)
        return replicas

    return _scale(deployment=deployment, role=role, target=check, actor=actor, reason=reason,
                  idempotency_key=idempotency_key, request={"replicas": replicas})


class PoolAtBound(ControlPlaneError):
    """A scale by a step that would change nothing: the pool is already at its min or max. Callers that act on
    their own (alert rules, webhooks) record it as skipped; an operator sees the message."""


def pool_scale_by(*, deployment: Deployment, role: str, step: int, actor, reason: str = "",
                  idempotency_key: str | None = None) -> Action:
    """Scale the deployment's `role` pool by `step` replicas (negative: down), clamped to min..max. The reason
    gets "; from → to replicas" appended. Raises PoolAtBound (400) when the clamped number equals the current one,
    and what pool_scale raises otherwise."""
    if isinstance(step, bool) or not isinstance(step, int) or step == 0:
        raise invalid(f"step must be a non-zero integer, not {step!r}", field="step")

    def clamp(pool: Pool) -> int:
        replicas = max(pool.min_replicas, min(pool.max_replicas, pool.desired_replicas + step))
        if replicas == pool.desired_replicas:
            bound = "max" if step > 0 else "min"
            raise PoolAtBound(f"{role} pool already at its {bound} ({pool.desired_replicas} replicas)",
                              code="at_bound", extra={"field": "step", "replicas": pool.desired_replicas})
        return replicas

    return _scale(deployment=deployment, role=role, target=clamp, actor=actor, reason=reason,
                  idempotency_key=idempotency_key, request={"step": step}, note_change=True)


def _scale(*, deployment: Deployment, role: str, target, actor, reason: str, idempotency_key: str | None,
           request: dict, note_change: bool = False) -> Action:
    """Lock the deployment and the pool, compute the new desired replicas from the locked pool (`target(pool)`,
    which may raise), record the scale action and set the desired state, in one transaction."""
    actor = as_actor(actor)

    def write() -> Action:
        nonlocal deployment, reason  # the row re-read under the lock; the reason gets the change
        deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
        if deployment_delete_pending(deployment) is not None:
            raise conflict(f"deployment {deployment.name!r} is being deleted")
        pool = Pool.objects.select_for_update().filter(deployment=deployment, role=role).first()
        if pool is None:
            roles = list(deployment.pools.order_by("role").values_list("role", flat=True))
            raise invalid(f"deployment {deployment.name!r} has no {role!r} pool (its pools: {roles})",
                          field="role")
        previous = pool.desired_replicas
        replicas = target(pool)
        if note_change:
            reason = f"{reason}; {previous} → {replicas} replicas"
        action = action_create(kind=ActionKind.SCALE, actor=actor, deployment=deployment, reason=reason,
                               params={"role": role, "from": previous, "to": replicas},
                               idempotency_key=idempotency_key)
        pool.desired_replicas = replicas
        pool.save(update_fields=["desired_replicas"])
        enqueue_reconcile(deployment.pk)
        return action

    return action_once(kind=ActionKind.SCALE, idempotency_key=idempotency_key, write=write,
                       request={"deployment": deployment.pk, "role": role, **request})


def pool_schedulable_set(*, pool: Pool, reason: str, num_unplaced: int) -> bool:
    """Record whether reconcile could place the pool's workers: `reason` says why not ("" once it could). A change
    is an audit row (the supervisor as actor), so operators see when and why a pool became unschedulable and when it
    recovered. Returns whether anything changed."""
    num_updated = Pool.objects.filter(pk=pool.pk).exclude(unschedulable_reason=reason).update(
        unschedulable_reason=reason, unschedulable_replicas=num_unplaced)
    pool.unschedulable_reason, pool.unschedulable_replicas = reason, num_unplaced
    if not num_updated:
        return False
    deployment = pool.deployment
    action_create(kind=ActionKind.UNSCHEDULABLE, actor=Actor.system("supervisor"), deployment=deployment,
                  reason=f"{pool.role} pool: {reason}" if reason else f"{pool.role} pool: every worker placed again",
                  status=ActionStatus.SUCCEEDED if not reason else ActionStatus.FAILED,
                  params={"role": pool.role, "num_unplaced": num_unplaced, "desired": pool.desired_replicas},
                  result={"reason": reason})
    return True


PLACEMENT_FIELDS = ("node_selector", "gpus_per_worker", "threads_per_worker", "allow_gpu_sharing", "routing_weights")
# More entries than any fleet has hardware classes is a mistake, not a configuration.
MAX_ROUTING_WEIGHTS = 16


def validate_routing_weights(entries, *, field: str = "routing_weights") -> list[dict]:
    """[{"selector": {labels}, "weight": number}, ...] → the same, checked: at most MAX_ROUTING_WEIGHTS entries,
    each a label selector ({} matches every node) and a weight above 0 and at most 100. 400 naming the entry."""
    if not isinstance(entries, list):
        raise invalid(f'{field} must be a list of {{"selector": {{label: value}}, "weight": number}} objects',
                      field=field)
    if len(entries) > MAX_ROUTING_WEIGHTS:
        raise invalid(f"{field} takes at most {MAX_ROUTING_WEIGHTS} entries, not {len(entries)}", field=field)
    cleaned = []
    for where, entry in each_object(entries, field=field):
        if set(entry) != {"selector", "weight"}:
            raise invalid(f"{where} must have exactly the keys selector and weight, not {sorted(entry)}",
                          field=where)
        selector = validate_labels(entry["selector"], field=f"{where}.selector")
        problem = weight_problem(entry["weight"])
        if problem:
            raise invalid(f"{where}.weight {problem}", field=f"{where}.weight")
        cleaned.append({"selector": selector, "weight": entry["weight"]})
    return cleaned


def validate_placement(changes: dict, *, field: str = "placement") -> dict:
    """{node_selector, gpus_per_worker, threads_per_worker, allow_gpu_sharing, routing_weights} (any of them) → the
    same, checked; 400 naming the bad field."""
    if not isinstance(changes, dict):
        raise invalid(f"{field} must be an object", field=field)
    changes = dict(changes)
    unknown = sorted(set(changes) - set(PLACEMENT_FIELDS))
    if unknown:
        raise invalid(f"unknown placement fields {unknown} (known: {list(PLACEMENT_FIELDS)})",
                      field=f"{field}.{unknown[0]}" if field != "placement" else unknown[0])
    if "node_selector" in changes:
        changes["node_selector"] = validate_labels(changes["node_selector"], field="node_selector")
    for name in ("gpus_per_worker", "threads_per_worker"):
        if name in changes:
            value = changes[name]
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 64:
                raise invalid(f"{name} must be an integer 0..64, not {value!r}", field=name)
    if "allow_gpu_sharing" in changes and not isinstance(changes["allow_gpu_sharing"], bool):
        raise invalid("allow_gpu_sharing must be true or false", field="allow_gpu_sharing")
    if "routing_weights" in changes:
        prefix = "" if field == "placement" else f"{field}."
        changes["routing_weights"] = validate_routing_weights(changes["routing_weights"],
                                                              field=f"{prefix}routing_weights")
    return changes


def pool_placement_set(*, deployment: Deployment, role: str, actor, reason: str = "", **changes) -> Action:
    """Change where a pool's workers may run: node_selector (labels), gpus_per_worker, threads_per_worker,
    allow_gpu_sharing; and how the gateway weighs them by their node's labels (routing_weights, in the endpoints
    answer at once). Running workers stay where they are; new ones (scale-ups, restarts) follow the new rule.
    400 naming the bad field; returns the `placement` action (params: the old and new values)."""
    actor = as_actor(actor)
    changes = validate_placement(changes)

    def write() -> Action:
        pool = Pool.objects.select_for_update().filter(deployment=deployment, role=role).first()
        if pool is None:
            raise invalid(f"deployment {deployment.name!r} has no {role!r} pool", field="role")
        before = {field: getattr(pool, field) for field in PLACEMENT_FIELDS}
        for field, value in changes.items():
            setattr(pool, field, value)
        pool.save(update_fields=list(changes) or ["node_selector"])
        action = action_create(kind=ActionKind.PLACEMENT, actor=actor, deployment=deployment, reason=reason,
                               status=ActionStatus.SUCCEEDED,
                               params={"role": role, "from": before,
                                       "to": {field: getattr(pool, field) for field in PLACEMENT_FIELDS}})
        enqueue_reconcile(deployment.pk)
        return action

    return action_once(kind=ActionKind.PLACEMENT, idempotency_key=None, write=write)
