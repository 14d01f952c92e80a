"""A deployment's autoscaling settings as the API's GET /deployments/{name}/autoscaling answers them: its switch and
each pool's policy, with a manual-scale pause and the last decision."""
from __future__ import annotations

import time
from datetime import datetime, timezone as dt_timezone

from django.conf import settings

from controlplane.autoscaling.autoscaler import manual_pause, policy_for
from controlplane.autoscaling.models import AutoscalingPolicy


def autoscaling_view(*, deployment) -> dict:
    """The settings of every pool. A pool read for the first time gets its default policy row (policy_for), as the
    autoscaler's pass would give it, so that what is shown is what the autoscaler acts on."""
    now = datetime.fromtimestamp(time.time(), tz=dt_timezone.utc)
    pools = {}
    for pool in deployment.pools.order_by("role"):
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


def policy_targets(deployment) -> list[tuple[str, float]]:
    """(metric, target) of each policy of the deployment's pools, as capacity reads them (capacity.autoscale_targets:
    what one replica carries within the autoscaler's targets)."""
    return list(AutoscalingPolicy.objects.filter(pool__deployment=deployment).values_list("metric", "target"))
