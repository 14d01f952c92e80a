"""Changes to a deployment's autoscaling settings (its switch, its mode and budget, and each pool's policy), made by
the API's PUT /deployments/{name}/autoscaling and the dashboard's switch, each recorded as one `autoscale` action."""
from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from controlplane.autoscaling.advice import advice_supersede_all
from controlplane.autoscaling.autoscaler import ADMISSION_ROLES, policy_for
from controlplane.autoscaling.models import AutoscaleMode, AutoscalingPolicy, DeploymentAutoscaling
from controlplane.autoscaling.selectors import autoscaling_settings
from controlplane.errors import invalid
from controlplane.models import ActionKind, ActionStatus
from controlplane.services.actions import action_create
from controlplane.services.deployments import deployment_autoscale_set


UNCHANGED = object()


def autoscaling_update(*, deployment, actor, enabled: bool | None = None, pools: dict | None = None,
                       mode: str | None = None, max_workers=UNCHANGED) -> None:
    """Change the deployment's switch, its mode, its budget (`max_workers`, None: none) and its pools' policies
    (400 naming a role the deployment has no pool for, a queue wait target on a pool that does not bound the
    gateway's admission, or a budget below the pools' min_replicas in all). Leaving advisory mode, or turning the
    autoscaler off, supersedes the open advice: nothing keeps it current any more."""
    pools = pools or {}
    by_role = {pool.role: pool for pool in deployment.pools.all()}
    if mode is not None and mode not in AutoscaleMode.values:
        raise invalid(f"mode must be one of {', '.join(AutoscaleMode.values)}, not {mode!r}", field="mode")
    if max_workers is not UNCHANGED and max_workers is not None:
        floor = sum(pool.min_replicas for pool in by_role.values())
        if max_workers < floor:
            raise invalid(f"max_workers {max_workers} is below the pools' min_replicas in all ({floor}), which "
                          f"the autoscaler keeps whatever the budget", field="max_workers")
    unknown = sorted(set(pools) - set(by_role))
    if unknown:
        raise invalid(f"deployment {deployment.name!r} has no pool {', '.join(unknown)} "
                      f"(its pools: {', '.join(sorted(by_role))})", field="pools")
    for role, changes in sorted(pools.items()):
        if changes.get("queue_wait_target") is not None and role not in ADMISSION_ROLES:
            admitting = [r for r in ADMISSION_ROLES if r in by_role]
            raise invalid(f"pools.{role}.queue_wait_target: the {role} pool does not bound the gateway's admission "
                          f"queue, so more {role} workers would not shorten it; set it on the "
                          f"{' or '.join(admitting)} pool", field=f"pools.{role}.queue_wait_target")
    row = autoscaling_settings(deployment)
    switched = {key: value for key, value in (("mode", mode), ("max_workers", max_workers))
                if value is not UNCHANGED and (key != "mode" or value is not None) and getattr(row, key) != value}
    with transaction.atomic():
        _record(deployment=deployment, actor=actor, enabled=enabled, pools=pools, switched=switched)
        if switched:
            DeploymentAutoscaling.objects.update_or_create(deployment=deployment,
                                                           defaults={**switched, "updated_at": timezone.now()})
        if enabled is False:
            advice_supersede_all(deployment=deployment, outcome="superseded: the autoscaler was turned off")
        elif switched.get("mode") == AutoscaleMode.ACTIVE:
            advice_supersede_all(deployment=deployment, outcome="superseded: the autoscaler was switched to active")
        if enabled is not None and enabled != deployment.autoscale_enabled:
            deployment_autoscale_set(deployment=deployment, enabled=enabled)
        for role, changes in pools.items():
            policy = policy_for(by_role[role])
            fields = {key: changes[key] for key in ("enabled", "metric", "target", "queue_wait_target")
                      if key in changes}
            if changes.get("resume"):
                fields["resumed_at"] = timezone.now()
            if fields:
                fields["updated_at"] = timezone.now()
                AutoscalingPolicy.objects.filter(pk=policy.pk).update(**fields)


def _record(*, deployment, actor, enabled: bool | None, pools: dict, switched: dict) -> None:
    """The audit row: switching the autoscaler or changing a policy changes who sizes the pools. Recorded
    succeeded, so action_create starts and finishes it at its creation time."""
    parts = []
    if enabled is not None and enabled != deployment.autoscale_enabled:
        parts.append(f"autoscaler {'on' if enabled else 'off'}")
    parts += [f"{key}={value}" for key, value in sorted(switched.items())]
    for role, changes in sorted(pools.items()):
        if changes:
            parts.append(f"{role}: " + ", ".join(f"{key}={value}" for key, value in sorted(changes.items())))
    if not parts:
        return
    action_create(kind=ActionKind.AUTOSCALE, actor=actor, deployment=deployment, reason="; ".join(parts),
                  params={"enabled": enabled, "pools": pools, **switched}, status=ActionStatus.SUCCEEDED)


def gated_change(deployment, *, enabled: bool | None = None, mode: str | None = None, pools: dict | None = None,
                 **unweighed) -> dict:
    """What an autoscaling_update with these arguments changes of how the fleet sizes itself, in the what-if's shape
    (controlplane/change_gate.py), for the change gate to weigh before it is applied: the switch (advisory mode
    counts as off: the fleet no longer scales by itself) and each pool's policy; a pool switched back on takes its
    stored metric and target. Empty where it changes none of it (a budget, a resume)."""
    scaling = {}
    if mode == AutoscaleMode.ADVISORY:
        enabled = False
    elif mode == AutoscaleMode.ACTIVE and enabled is None:
        enabled = deployment.autoscale_enabled
    if enabled is not None:
        scaling["enabled"] = enabled
    stored = {policy.pool.role: policy for policy in
              AutoscalingPolicy.objects.filter(pool__deployment=deployment).select_related("pool")}
    gated_pools = {}
    for role, fields in (pools or {}).items():
        part = {key: fields[key] for key in ("metric", "target", "queue_wait_target") if key in fields}
        if fields.get("enabled") is False:
            part = {"enabled": False}
        elif fields.get("enabled") is True and role in stored:
            row = stored[role]
            part = {"metric": row.metric, "target": row.target, "queue_wait_target": row.queue_wait_target, **part}
        if part:
            gated_pools[role] = part
    if gated_pools:
        scaling["pools"] = gated_pools
    return {"autoscaling": scaling} if scaling else {}
