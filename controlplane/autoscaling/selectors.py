"""A deployment's autoscaling settings as the API's GET /deployments/{name}/autoscaling answers them: its switch, mode
and budget and each pool's policy, with a manual-scale pause, the last decision and the open advice; and the advice
the autoscaler recorded in advisory mode (GET .../autoscaling/advice, the deployment page)."""
from __future__ import annotations

import time
from datetime import datetime, timezone as dt_timezone

from django.conf import settings

from controlplane.autoscaling.advice import open_advice
from controlplane.autoscaling.autoscaler import manual_pause, policy_for
from controlplane.autoscaling.models import AutoscalingPolicy, DeploymentAutoscaling, ScaleAdvice


def autoscaling_settings(deployment) -> DeploymentAutoscaling:
    """The deployment's mode and budget; an unsaved default row (active, no budget) where none was written."""
    return (DeploymentAutoscaling.objects.filter(deployment=deployment).first()
            or DeploymentAutoscaling(deployment=deployment))


def autoscaling_view(*, deployment) -> dict:
    """The settings of every pool. A pool read for the first time gets its default policy row (policy_for), as the
    autoscaler's pass would give it, so that what is shown is what the autoscaler acts on."""
    now = datetime.fromtimestamp(time.time(), tz=dt_timezone.utc)
    pools, row = {}, autoscaling_settings(deployment)
    deployment_pools = list(deployment.pools.order_by("role"))
    advice = open_advice([pool.pk for pool in deployment_pools])
    for pool in deployment_pools:
        policy = policy_for(pool)
        pause = manual_pause(pool, policy, now=now)
        pools[pool.role] = {
            "enabled": policy.enabled,
            "metric": policy.metric,
            "target": policy.target,
            "queue_wait_target": policy.queue_wait_target,
            "replicas": pool.desired_replicas,
            "min_replicas": pool.min_replicas,
            "max_replicas": pool.max_replicas,
            "paused_until": pause.until.isoformat() if pause else None,
            "paused_by_action": pause.action_id if pause else None,
            "last_evaluated_at": policy.last_evaluated_at.isoformat() if policy.last_evaluated_at else None,
            "last_decision": policy.last_decision,
            "advice": advice_row(advice[pool.pk], role=pool.role) if pool.pk in advice else None,
        }
    return {
        "deployment": deployment.name,
        "enabled": deployment.autoscale_enabled,
        "mode": row.mode,
        "max_workers": row.max_workers,
        "num_workers": sum(pool.desired_replicas for pool in deployment_pools),
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


def advice_list(*, deployment, role: str | None = None, status: str | None = None,
                limit: int = 50) -> list[dict]:
    """The deployment's advice, newest first (of one pool, or of one status, where asked)."""
    rows = ScaleAdvice.objects.filter(pool__deployment=deployment).select_related("pool")
    if role:
        rows = rows.filter(pool__role=role)
    if status:
        rows = rows.filter(status=status)
    return [advice_row(row, role=row.pool.role) for row in rows.order_by("-created_at", "-id")[:limit]]


def advice_row(advice: ScaleAdvice, *, role: str) -> dict:
    return {
        "id": advice.pk, "role": role, "status": advice.status,
        "from_replicas": advice.from_replicas, "to_replicas": advice.to_replicas,
        "metric": advice.metric, "observed": advice.observed, "target": advice.target, "ratio": advice.ratio,
        "raw": advice.raw, "inputs": advice.inputs, "reason": advice.reason,
        "created_at": advice.created_at.isoformat(), "evaluated_at": advice.evaluated_at.isoformat(),
        "num_evaluations": advice.num_evaluations,
        "settled_at": advice.settled_at.isoformat() if advice.settled_at else None, "outcome": advice.outcome,
        "applied_by": advice.applied_by, "action": advice.action_id,
    }


def policy_targets(deployment) -> list[tuple[str, float]]:
    """(metric, target) of each policy of the deployment's pools, as capacity reads them (capacity.autoscale_targets:
    what one replica carries within the autoscaler's targets)."""
    return list(AutoscalingPolicy.objects.filter(pool__deployment=deployment).values_list("metric", "target"))
