"""The autoscaler works within the active schedules' floor and ceiling; schedule writes are validated and audited."""
import time
from datetime import datetime, timezone

import pytest

from controlplane.autoscaling.autoscaler import autoscale_pool
from controlplane.capacity.models import PoolSchedule
from controlplane.capacity.services.bounds import pool_bounds
from controlplane.capacity.services.schedules import schedule_create, schedule_delete, schedule_update
from controlplane.errors import ControlPlaneError
from controlplane.models import Action, ActorType, Pool
from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Sample


@pytest.fixture
def scaled(deployment, make_worker):
    deployment.autoscale_enabled = True
    deployment.save()
    make_worker(deployment, "decode")
    return deployment


def decode_pool(deployment) -> Pool:
    return Pool.objects.select_related("deployment").get(deployment=deployment, role="decode")


def always(pool, operator, **bounds) -> PoolSchedule:
    """A window that is open at any instant: every minute, for a day."""
    return schedule_create(pool=pool, actor=operator, name=f"always-{len(bounds)}-{sorted(bounds.items())}",
                           cron="* * * * *", duration_minutes=1440, timezone="UTC", **bounds)


def test_an_active_floor_scales_an_idle_pool_up_to_it(scaled, operator):
    always(decode_pool(scaled), operator, min_replicas=4)
    decision = autoscale_pool(decode_pool(scaled), now=time.time())  # no data at all: HPA alone would keep 1
    assert decision.desired == 4 and "schedule" in decision.reason
    action = Action.objects.get(deployment=scaled, kind="scale", actor_type=ActorType.AUTOSCALER)
    assert action.params == {"role": "decode", "from": 1, "to": 4}
    assert decode_pool(scaled).desired_replicas == 4


def test_an_active_ceiling_caps_what_the_metric_asks_for(scaled, operator):
    always(decode_pool(scaled), operator, max_replicas=2)
    Sample.objects.create(ts=time.time() - 1, deployment_id=scaled.pk, role="decode", worker_id=None,
                          metric=METRIC_IDS["itl_p99_seconds"], value=0.3)  # 3 × the target: HPA asks for 3
    decision = autoscale_pool(decode_pool(scaled), now=time.time())
    assert decision.desired == 2


def test_outside_its_window_a_schedule_leaves_the_pool_bounds(scaled, operator):
    pool = decode_pool(scaled)
    schedule_create(pool=pool, actor=operator, name="weekdays", cron="0 9 * * 1-5", duration_minutes=540,
                    timezone="Europe/Paris", min_replicas=4)
    monday_10_paris = datetime(2026, 11, 30, 9, 0, tzinfo=timezone.utc)
    saturday = datetime(2026, 12, 5, 9, 0, tzinfo=timezone.utc)
    assert pool_bounds([pool], now=monday_10_paris)[pool.pk].min_replicas == 4
    assert pool_bounds([pool], now=saturday)[pool.pk].min_replicas == pool.min_replicas == 1


def test_overlapping_windows_take_the_highest_floor_and_lowest_ceiling(scaled, operator):
    pool = decode_pool(scaled)
    always(pool, operator, min_replicas=2, max_replicas=6)
    always(pool, operator, min_replicas=3)
    always(pool, operator, max_replicas=5)
    bounds = pool_bounds([pool], now=datetime.now(timezone.utc))[pool.pk]
    assert (bounds.min_replicas, bounds.max_replicas) == (3, 5)


def test_schedule_bounds_outside_the_pools_own_are_refused_naming_the_role(deployment, operator):
    pool = decode_pool(deployment)  # min 1, max 8
    with pytest.raises(ControlPlaneError) as err:
        schedule_create(pool=pool, actor=operator, name="too-many", cron="0 9 * * *", duration_minutes=60,
                        min_replicas=9)
    assert err.value.status == 400 and err.value.extra == {"field": "min_replicas", "role": "decode"}
    assert "1..8" in err.value.message
    assert not PoolSchedule.objects.exists()


def test_every_change_is_an_audited_autoscale_action(deployment, operator):
    pool = decode_pool(deployment)
    schedule = schedule_create(pool=pool, actor=operator, name="business", cron="0 9 * * 1-5",
                               duration_minutes=540, timezone="Europe/Paris", min_replicas=2)
    schedule_update(schedule=schedule, actor=operator, min_replicas=3)
    schedule_delete(schedule=schedule, actor=operator)
    reasons = list(Action.objects.filter(deployment=deployment, kind="autoscale").order_by("id")
                   .values_list("reason", "actor", "params__role"))
    assert reasons == [("decode pool: schedule 'business' created", operator.username, "decode"),
                       ("decode pool: schedule 'business' changed", operator.username, "decode"),
                       ("decode pool: schedule 'business' deleted", operator.username, "decode")]
