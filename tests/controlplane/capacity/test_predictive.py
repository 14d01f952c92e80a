"""Predictive floors on a replayed daily curve: three previous days ramp from 1 to 12 requests/s at 09:00; with a
15-minute lead the decode pool's floor, and the autoscaler's replicas, rise before today's load does."""
from datetime import datetime, timedelta, timezone

import pytest

from controlplane.autoscaling.autoscaler import autoscale_pool
from controlplane.capacity.models import PredictiveScaling
from controlplane.capacity.services.bounds import pool_bounds
from controlplane.capacity.services.schedules import predictive_set
from controlplane.errors import ControlPlaneError
from controlplane.models import Action, ActorType, Pool
from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Rollup, Sample

TODAY = datetime(2026, 11, 30, tzinfo=timezone.utc)
RAMP = timedelta(hours=9)


def rate_at(moment: datetime) -> float:
    return 12.0 if (moment - moment.replace(hour=0, minute=0, second=0)) >= RAMP else 1.0


@pytest.fixture
def history(deployment):
    """Minute rollups of the prefill pool's qps, 07:00-11:00 on each of the three previous days."""
    rows = []
    for day in (1, 2, 3):
        start = TODAY - timedelta(days=day) + timedelta(hours=7)
        for minute in range(240):
            moment = start + timedelta(minutes=minute)
            value = rate_at(moment)
            rows.append(Rollup(ts=moment.timestamp(), deployment_id=deployment.pk, role="prefill", worker_id=None,
                               metric=METRIC_IDS["qps"], avg=value, min=value, max=value, count=12))
    Rollup.objects.bulk_create(rows)
    return deployment


def today_load(deployment, moment: datetime) -> float:
    """Today's traffic follows the same curve; stored as a raw sample at `moment` and returned."""
    value = rate_at(moment)
    Sample.objects.create(ts=moment.timestamp(), deployment_id=deployment.pk, role="prefill", worker_id=None,
                          metric=METRIC_IDS["qps"], value=value)
    return value


def test_the_predicted_floor_rises_before_the_load_does(history, operator):
    pool = Pool.objects.select_related("deployment").get(deployment=history, role="decode")
    predictive_set(pool=pool, actor=operator, enabled=True, lead_time_s=900, history_days=3,
                   requests_per_replica=3.0)
    floors, loads = {}, {}
    moment = TODAY + timedelta(hours=8)
    while moment <= TODAY + timedelta(hours=9, minutes=30):
        loads[moment] = today_load(history, moment)
        floors[moment] = pool_bounds([pool], now=moment)[pool.pk].min_replicas
        moment += timedelta(minutes=5)
    first_floor_rise = min(t for t, floor in floors.items() if floor > 1)
    first_load_rise = min(t for t, load in loads.items() if load > 1)
    assert floors[TODAY + timedelta(hours=8)] == 1
    assert floors[first_floor_rise] == 4  # ceil(12 / 3)
    assert first_load_rise == TODAY + RAMP
    assert first_load_rise - first_floor_rise >= timedelta(minutes=10)
    assert PredictiveScaling.objects.get(pool=pool).last_forecast_rps == 12.0


def test_the_autoscaler_scales_to_the_predicted_floor_ahead_of_the_ramp(history, operator, make_worker):
    history.autoscale_enabled = True
    history.save()
    make_worker(history, "decode")
    pool = Pool.objects.select_related("deployment").get(deployment=history, role="decode")
    predictive_set(pool=pool, actor=operator, enabled=True, lead_time_s=900, history_days=3,
                   requests_per_replica=3.0)
    quiet = TODAY + timedelta(hours=8)
    assert autoscale_pool(pool, now=quiet.timestamp()).desired == 1
    ahead = TODAY + timedelta(hours=8, minutes=50)
    assert rate_at(ahead) == 1.0  # the load has not risen yet
    decision = autoscale_pool(Pool.objects.select_related("deployment").get(pk=pool.pk), now=ahead.timestamp())
    assert decision.desired == 4 and "predictive floor 4" in decision.reason
    assert Action.objects.filter(deployment=history, kind="scale", actor_type=ActorType.AUTOSCALER,
                                 params__to=4).exists()


def test_predictive_needs_a_per_replica_rate_and_a_sane_lead_time(deployment, operator):
    pool = Pool.objects.get(deployment=deployment, role="decode")
    with pytest.raises(ControlPlaneError) as err:
        predictive_set(pool=pool, actor=operator, enabled=True)
    assert err.value.extra == {"field": "requests_per_replica", "role": "decode"}
    with pytest.raises(ControlPlaneError) as err:
        predictive_set(pool=pool, actor=operator, lead_time_s=-5)
    assert err.value.extra["field"] == "lead_time_s"
    assert not PredictiveScaling.objects.filter(enabled=True).exists()


def test_enabled_without_a_rate_it_takes_one_from_the_profile_and_the_observed_traffic(deployment, operator):
    import time

    from controlplane.capacity.models import Profile

    revision = deployment.current_revision
    Profile.objects.create(revision=revision, role="prefill", max_num_seqs=32, max_batch_tokens=2048,
                           kv_capacity_tokens=60_000, fits={"prefill": {"a": 0.01, "b": 2e-4, "c": 0.0}})
    Profile.objects.create(revision=revision, role="decode", max_num_seqs=32, max_batch_tokens=2048,
                           kv_capacity_tokens=60_000, fits={"decode": {"a": 0.01, "b": 5e-4, "c": 1e-7}})
    now = time.time()
    for metric, role, value in (("qps", "prefill", 2.0), ("prompt_tokens_per_second", "prefill", 400.0),
                                ("generation_tokens_per_second", "decode", 100.0)):
        Sample.objects.create(ts=now - 30, deployment_id=deployment.pk, role=role, worker_id=None,
                              metric=METRIC_IDS[metric], value=value)
    pool = Pool.objects.select_related("deployment").get(deployment=deployment, role="decode")
    policy = predictive_set(pool=pool, actor=operator, enabled=True, lead_time_s=600)
    # One decode replica at 200-token prompts and 50-token outputs within a 100 ms ITL: several requests/s.
    assert 1.0 < policy.requests_per_replica < 1000
