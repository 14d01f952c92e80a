"""Creating and deleting deployments (admin). Both only write desired state; reconcile makes it so. Every other
write of a Deployment row (its current revision, autoscaler switch, gateway port, the final delete) is a function
here too, whichever app asks for it."""
from __future__ import annotations

import socket

from django.conf import settings
from django.db import IntegrityError

from controlplane.errors import conflict, invalid
from controlplane.models import Action, ActionKind, ActionStatus, Deployment, DeploymentMode, Pool, Revision
from controlplane.models.deployments import ROLES_BY_MODE
from controlplane.selectors import deployment_delete_pending
from controlplane.services.actions import action_create, action_once, as_actor, enqueue_reconcile
from controlplane.services.objectives import objectives_merge, validate_objectives
from controlplane.services.pools import validate_placement
from controlplane.services.validation import (DEFAULT_DTYPE, check_kv_cache_dtype, check_model_context,
                                              revision_dtype, validate_engine_settings, validate_model_path,
                                              validate_name, validate_port,
                                              validate_replica_bounds, validate_sampling_defaults)

DEFAULT_REPLICAS = 1


def _can_bind(port: int) -> bool:
    # Single-host helper: skip a port that something on this host already listens on (another engineer's demo,
    # an unrelated service). With several hosts the gateway's node may differ; a clash there shows up as a
    # failed gateway start with the port in its last_error.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def gateway_port_pick() -> int:
    """The first port from TANDEM_GATEWAY_PORT up that no deployment uses and nothing here listens on."""
    taken = set(Deployment.objects.exclude(gateway_port=None).values_list("gateway_port", flat=True))
    for port in range(settings.TANDEM_GATEWAY_PORT, 65536):
        if port not in taken and port != settings.TANDEM_WEB_PORT and _can_bind(port):
            return port
    raise conflict(f"no free gateway port from {settings.TANDEM_GATEWAY_PORT} up")


def _pool_specs(mode: str, replicas: dict | None, min_replicas: dict | None,
                max_replicas: dict | None) -> list[dict]:
    roles = [str(role) for role in ROLES_BY_MODE[DeploymentMode(mode)]]
    for label, values in (("replicas", replicas), ("min_replicas", min_replicas), ("max_replicas", max_replicas)):
        if values is None:
            continue
        if not isinstance(values, dict):
            raise invalid(f"{label} must be an object of role → number", field=label)
        stray = sorted(set(values) - set(roles))
        if stray:
            raise invalid(f"{label} names roles {stray} that a {mode} deployment does not have (it has {roles})",
                          field=label)
    specs = []
    for role in roles:
        desired = (replicas or {}).get(role, DEFAULT_REPLICAS)
        is_count = isinstance(desired, int) and not isinstance(desired, bool)
        # Defaults keep a serving pool from being scaled to nothing by accident; 0 replicas asked means min 0.
        low = (min_replicas or {}).get(role, 1 if is_count and desired >= 1 else 0)
        high = (max_replicas or {}).get(role, max(settings.TANDEM_DEFAULT_MAX_REPLICAS, desired) if is_count
                                        else settings.TANDEM_DEFAULT_MAX_REPLICAS)
        validate_replica_bounds(role, replicas=desired, min_replicas=low, max_replicas=high)
        specs.append({"role": role, "desired_replicas": desired, "min_replicas": low, "max_replicas": high})
    return specs


def _placement_into(specs: list[dict], placement: dict | None, mode: str) -> None:
    """Each role's placement (pools.validate_placement) onto its pool spec; 400 for a role the mode has not."""
    if placement is None:
        return
    if not isinstance(placement, dict):
        raise invalid("placement must be an object of role → placement", field="placement")
    roles = [spec["role"] for spec in specs]
    stray = sorted(set(placement) - set(roles))
    if stray:
        raise invalid(f"placement names roles {stray} that a {mode} deployment does not have (it has {roles})",
                      field="placement")
    for spec in specs:
        if spec["role"] in placement:
            spec.update(validate_placement(placement[spec["role"]], field=f"placement.{spec['role']}"))


def deployment_create(*, name: str, mode: str, model_path: str, dtype: str | None = None,
                      engine_settings: dict | None = None, sampling_defaults: dict | None = None,
                      replicas: dict | None = None,
                      min_replicas: dict | None = None, max_replicas: dict | None = None,
                      gateway_port: int | None = None, placement: dict | None = None,
                      objectives: dict | None = None, actor, reason: str = "",
                      idempotency_key: str | None = None, comment: str = "initial revision") -> Action:
    """Create a deployment with revision 1, its pools and a `create` action; reconcile starts its workers.

    1. Validate name, mode, model folder, dtype (the field or engine_settings.common.dtype; default auto), engine
       settings (common and the mode's roles), sampling defaults, per-role replicas within min..max
       (defaults: 1 replica, min 1 (0 if 0 replicas are asked), max 8) and objectives (defaults where not given).
    2. Pick the gateway port (given, else the first free from TANDEM_GATEWAY_PORT up).
    3. Insert deployment, revision 1 (current), pools and the action in one transaction; reconcile after commit.
    Returns the `create` Action (action.deployment is the new deployment).
    """
    actor = as_actor(actor)
    validate_name(name)
    if mode not in DeploymentMode.values:
        raise invalid(f"mode {mode!r} is not one of {', '.join(DeploymentMode.values)}", field="mode")
    model_path = validate_model_path(model_path)
    engine_settings = validate_engine_settings(
        engine_settings, roles=tuple(str(role) for role in ROLES_BY_MODE[DeploymentMode(mode)]))
    dtype = revision_dtype(dtype, engine_settings) or DEFAULT_DTYPE
    check_kv_cache_dtype(dtype, engine_settings)
    check_model_context(model_path, engine_settings)
    sampling_defaults = validate_sampling_defaults(sampling_defaults)
    specs = _pool_specs(mode, replicas, min_replicas, max_replicas)
    _placement_into(specs, placement, mode)
    objectives = objectives_merge(None, validate_objectives(objectives))
    if gateway_port is not None:
        validate_port(gateway_port)
        if gateway_port == settings.TANDEM_WEB_PORT:
            raise invalid(f"gateway_port {gateway_port} is the web port", field="gateway_port")

    def write() -> Action:
        if Deployment.objects.filter(name=name).exists():
            raise conflict(f"deployment {name!r} already exists", field="name")
        if gateway_port is None:
            port = gateway_port_pick()
        elif Deployment.objects.filter(gateway_port=gateway_port).exists():
            raise conflict(f"gateway_port {gateway_port} is used by another deployment", field="gateway_port")
        else:
            port = gateway_port
        deployment = Deployment.objects.create(name=name, mode=mode, gateway_port=port,
                                               sampling_defaults=sampling_defaults, objectives=objectives,
                                               created_by=actor.user)
        revision = Revision.objects.create(deployment=deployment, number=1, model_path=model_path,
                                           dtype=dtype, engine_settings=engine_settings,
                                           comment=comment, created_by=actor.user)
        deployment.current_revision = revision
        deployment.save(update_fields=["current_revision"])
        Pool.objects.bulk_create([Pool(deployment=deployment, **spec) for spec in specs])
        action = action_create(
            kind=ActionKind.CREATE, actor=actor, deployment=deployment, reason=reason,
            params={"mode": mode, "model_path": model_path, "dtype": dtype, "engine_settings": engine_settings,
                    "sampling_defaults": sampling_defaults, "pools": specs, "gateway_port": port, "revision": 1,
                    "objectives": objectives},
            idempotency_key=idempotency_key)
        enqueue_reconcile(deployment.pk)
        return action

    try:
        return action_once(kind=ActionKind.CREATE, idempotency_key=idempotency_key, write=write, request={
            "name": name, "mode": mode, "model_path": model_path, "dtype": dtype, "engine_settings": engine_settings,
            "sampling_defaults": sampling_defaults, "pools": specs, "gateway_port": gateway_port,
            "objectives": objectives})
    except IntegrityError:
        # Two creates raced past the checks above: the unique name or port decided.
        raise conflict(f"deployment {name!r} or its gateway port was taken at the same time; try again") from None


def deployment_sampling_defaults_set(*, deployment: Deployment, sampling_defaults: dict, actor, reason: str = "",
                                     idempotency_key: str | None = None) -> Action:
    """Replace a deployment's sampling defaults (operator). The gateway picks them up at its next membership poll;
    no worker restarts. 400 naming the bad field; returns the `sampling` action (params: from and to)."""
    actor = as_actor(actor)
    sampling_defaults = validate_sampling_defaults(sampling_defaults)

    def write() -> Action:
        nonlocal deployment  # re-read under the lock
        deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
        if deployment_delete_pending(deployment) is not None:
            raise conflict(f"deployment {deployment.name!r} is being deleted")
        before = dict(deployment.sampling_defaults or {})
        deployment.sampling_defaults = sampling_defaults
        deployment.save(update_fields=["sampling_defaults"])
        return action_create(kind=ActionKind.SAMPLING, actor=actor, deployment=deployment, reason=reason,
                             status=ActionStatus.SUCCEEDED, params={"from": before, "to": sampling_defaults},
                             idempotency_key=idempotency_key)

    return action_once(kind=ActionKind.SAMPLING, idempotency_key=idempotency_key, write=write, request={
        "deployment": deployment.pk, "sampling_defaults": sampling_defaults})


def deployment_delete(*, deployment: Deployment, actor, reason: str = "",
                      idempotency_key: str | None = None) -> Action:
    """Ask for a deployment to go away: pools to 0 and a pending `delete` action.

    Reconcile stops its workers and gateway, then deletes the row and finishes the action; the action rows
    outlive it. Deleting twice returns the pending delete action.
    """
    actor = as_actor(actor)

    def write() -> Action:
        nonlocal deployment  # re-read under the lock
        deployment = Deployment.objects.select_for_update().get(pk=deployment.pk)
        pending = deployment_delete_pending(deployment)
        if pending is not None:
            return pending
        pools = {pool.role: pool.desired_replicas for pool in deployment.pools.all()}
        deployment.pools.update(min_replicas=0, desired_replicas=0)
        action = action_create(kind=ActionKind.DELETE, actor=actor, deployment=deployment, reason=reason,
                               params={"pools": pools}, status=ActionStatus.PENDING,
                               idempotency_key=idempotency_key)
        enqueue_reconcile(deployment.pk)
        return action

    try:
        return action_once(kind=ActionKind.DELETE, idempotency_key=idempotency_key, write=write,
                           request={"deployment": deployment.pk})
    except Deployment.DoesNotExist:
        from controlplane.errors import not_found

        raise not_found(f"deployment {deployment.name!r} does not exist") from None


def deployment_revision_set(*, deployment: Deployment, revision: Revision) -> None:
    """Make `revision` the deployment's current one (inside the caller's transaction: a rollout's promotion)."""
    deployment.current_revision = revision
    deployment.save(update_fields=["current_revision"])


def deployment_autoscale_set(*, deployment: Deployment, enabled: bool) -> None:
    """Turn the deployment's autoscaler on or off (inside the caller's transaction, beside its Action)."""
    deployment.autoscale_enabled = enabled
    deployment.save(update_fields=["autoscale_enabled"])


def deployment_gateway_port_set(*, deployment: Deployment, port: int) -> None:
    """Move the deployment's gateway to `port` (inside the caller's transaction, under its lock on the row; the
    caller checks that no other deployment has it and restarts the running gateway)."""
    Deployment.objects.filter(pk=deployment.pk).update(gateway_port=port)


def deployment_remove(*, deployment: Deployment) -> None:
    """Delete the row of a deployment whose delete action reconcile has carried out (no process left): its pools,
    revisions and workers cascade; its Action rows stay, the audit log."""
    deployment.delete()
