"""A deployment's autoscaling settings: its switch and each pool's policy, read (`autoscaling_view`) and changed
(`autoscaling_update`) by the API's GET/PUT /deployments/{name}/autoscaling and the dashboard's switch."""
from __future__ import annotations

import time
from datetime import datetime, timezone as dt_timezone

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.autoscaling.autoscaler import manual_pause, policy_for
from controlplane.errors import invalid
from controlplane.models import ActionKind, ActionStatus
from controlplane.observability.models import AutoscaleMetric, AutoscalingPolicy
from controlplane.services.actions import action_create

METRIC_CHOICES = AutoscaleMetric.choices


def autoscaling_view(*, deployment) -> dict:
    now = datetime.fromtimestamp(time.time(), tz=dt_timezone.utc)
    pools = {}
    for pool in deployment.pools.order_by("role"):
        policy = policy_for(pool)
        pause = manual_pause(pool, policy, now=now)
        pools[pool.role] = {
            "enabled": policy.enabled,
            "metric": policy.metric,
            "target": policy.target,
            "replicas": pool.desired_replicas,
            "min_replicas": pool.min_replicas,
            "max_replicas": pool.max_replicas,
            "paused_until": pause.until.isoformat() if pause else None,
            "paused_by_action": pause.action_id if pause else None,
            "last_evaluated_at": policy.last_evaluated_at.isoformat() if policy.last_evaluated_at else None,
            "last_decision": policy.last_decision,
        }
    return {
        "deployment": deployment.name,
        "enabled": deployment.autoscale_enabled,
        "rule": (f"A scale of a pool by anyone but the autoscaler pauses that pool's autoscaler for "
                 f"{settings.TANDEM_AUTOSCALE_MANUAL_PAUSE_S} s; PUT {{\"pools\": {{role: {{\"resume\": true}}}}}} "
                 f"ends the pause. The autoscaler stays within the pool's min..max."),
        "tolerance": settings.TANDEM_AUTOSCALE_TOLERANCE_PCT / 100,
        "scale_up_stabilization_s": settings.TANDEM_AUTOSCALE_UP_STABILIZATION_S,
        "scale_down_stabilization_s": settings.TANDEM_AUTOSCALE_DOWN_STABILIZATION_S,
        "max_step": settings.TANDEM_AUTOSCALE_MAX_STEP,
        "step_period_s": settings.TANDEM_AUTOSCALE_STEP_PERIOD_S,
        "pools": pools,
    }


def autoscaling_update(*, deployment, actor, enabled: bool | None = None, pools: dict | None = None) -> None:
    """Change the deployment's switch and its pools' policies (400 naming a role the deployment has no pool for)."""
    pools = pools or {}
    by_role = {pool.role: pool for pool in deployment.pools.all()}
    unknown = sorted(set(pools) - set(by_role))
    if unknown:
        raise invalid(f"deployment {deployment.name!r} has no pool {', '.join(unknown)} "
                      f"(its pools: {', '.join(sorted(by_role))})", field="pools")
    with transaction.atomic():
        _record(deployment=deployment, actor=actor, enabled=enabled, pools=pools)
        if enabled is not None and enabled != deployment.autoscale_enabled:
            deployment.autoscale_enabled = enabled
            deployment.save(update_fields=["autoscale_enabled"])
        for role, changes in pools.items():
            policy = policy_for(by_role[role])
            fields = {key: changes[key] for key in ("enabled", "metric", "target") if key in changes}
            if changes.get("resume"):
                fields["resumed_at"] = timezone.now()
            if fields:
                fields["updated_at"] = timezone.now()
                AutoscalingPolicy.objects.filter(pk=policy.pk).update(**fields)


def _record(*, deployment, actor, enabled: bool | None, pools: dict) -> None:
    """The audit row: switching the autoscaler or changing a policy changes who sizes the pools."""
    parts = []
    if enabled is not None and enabled != deployment.autoscale_enabled:
        parts.append(f"autoscaler {'on' if enabled else 'off'}")
    for role, changes in sorted(pools.items()):
        if changes:
            parts.append(f"{role}: " + ", ".join(f"{key}={value}" for key, value in sorted(changes.items())))
    if not parts:
        return
    action = action_create(kind=ActionKind.AUTOSCALE, actor=actor, deployment=deployment, reason="; ".join(parts),
                           params={"enabled": enabled, "pools": pools}, status=ActionStatus.SUCCEEDED)
    type(action).objects.filter(pk=action.pk).update(finished_at=action.created_at)
