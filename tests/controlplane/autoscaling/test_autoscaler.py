"""The per-pool autoscaler against the database, one evaluation at a time: it scales through pool_scale with the
numbers in the reason, holds while new workers start, and a manual scale pauses it."""
import time

import pytest

from controlplane.autoscaling.autoscaler import autoscale_pool
from controlplane.autoscaling.models import AutoscalingPolicy
from controlplane.models import Action, ActorType
from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Sample
from controlplane.services import pool_scale
from tests.controlplane.autoscaling.support import pool_of


def observe(deployment, metric, value, *, role="decode", at=None):
    Sample.objects.create(ts=at or time.time() - 1, deployment_id=deployment.pk, role=role, worker_id=None,
                          metric=METRIC_IDS[metric], value=value)


def autoscaler_actions(deployment):
    return Action.objects.filter(deployment=deployment, kind="scale", actor_type=ActorType.AUTOSCALER)


def test_p99_itl_three_times_the_target_scales_decode_up_by_the_bounded_step(scaled):
    observe(scaled, "itl_p99_seconds", 0.3)  # default decode target: 100 ms
    decision = autoscale_pool(pool_of(scaled), now=time.time())
    assert decision.desired == 3  # ceil(1 × 3) = 3, within the step of ±2
    [action] = autoscaler_actions(scaled)
    assert action.params == {"role": "decode", "from": 1, "to": 3}
    assert action.actor == "autoscaler" and "itl_p99_seconds 0.3 vs target 0.1" in action.reason
    assert pool_of(scaled).desired_replicas == 3
    assert f"action #{action.pk}" in AutoscalingPolicy.objects.get(pool__deployment=scaled, pool__role="decode") \
        .last_decision


def test_it_holds_a_further_scale_up_until_the_new_workers_are_ready(scaled, settings):
    settings.TANDEM_AUTOSCALE_MAX_STEP = 10  # so that only the hold stops the second step
    observe(scaled, "itl_p99_seconds", 0.3)
    assert autoscale_pool(pool_of(scaled), now=time.time()).desired == 3
    decision = autoscale_pool(pool_of(scaled), now=time.time() + 5)  # still 1 of 3 ready, still slow
    assert decision.desired == 3 and "held: 1 of 3 workers ready" in decision.reason
    assert autoscaler_actions(scaled).count() == 1


def test_within_tolerance_or_without_data_nothing_is_written(scaled):
    assert autoscale_pool(pool_of(scaled), now=time.time()).desired == 1  # no sample at all: no data
    observe(scaled, "itl_p99_seconds", 0.105)
    decision = autoscale_pool(pool_of(scaled), now=time.time())
    assert not decision.changes and "within tolerance" in decision.reason
    assert not autoscaler_actions(scaled).exists()


def test_it_does_nothing_while_the_deployment_or_the_pool_policy_is_off(deployment, make_worker):
    make_worker(deployment, "decode")
    observe(deployment, "itl_p99_seconds", 0.3)
    assert autoscale_pool(pool_of(deployment), now=time.time()) is None  # autoscale_enabled is off by default
    deployment.autoscale_enabled = True
    deployment.save()
    AutoscalingPolicy.objects.filter(pool__deployment=deployment).update(enabled=False)
    assert autoscale_pool(pool_of(deployment), now=time.time()) is None
    assert not autoscaler_actions(deployment).exists()


def test_a_manual_scale_pauses_the_autoscaler_of_that_pool_only(scaled, operator, make_worker):
    make_worker(scaled, "prefill")
    pool_scale(deployment=scaled, role="decode", replicas=2, actor=operator, reason="by hand")
    observe(scaled, "itl_p99_seconds", 0.3)
    observe(scaled, "ttft_p99_seconds", 3.0, role="prefill")  # default prefill target: 1 s
    assert autoscale_pool(pool_of(scaled), now=time.time()) is None
    policy = AutoscalingPolicy.objects.get(pool__deployment=scaled, pool__role="decode")
    assert policy.last_decision.startswith("paused until") and "(otto-operator)" in policy.last_decision
    assert pool_of(scaled).desired_replicas == 2  # the operator's choice stands
    assert autoscale_pool(pool_of(scaled, "prefill"), now=time.time()).desired == 3  # the other pool still scales


def test_an_idle_pool_shrinks_to_its_min_after_the_down_window(scaled, operator, settings):
    settings.TANDEM_AUTOSCALE_MANUAL_PAUSE_S = 0  # the setup scale below must not pause the test
    pool_scale(deployment=scaled, role="decode", replicas=3, actor=operator)
    now = time.time()
    observe(scaled, "qps", 0.0, at=now - 1)  # served nothing: latency has no data, read as 0
    first = autoscale_pool(pool_of(scaled), now=now)
    assert first.desired == 3 and first.raw == 0  # the down window just started
    observe(scaled, "qps", 0.0, at=now + 150)
    assert autoscale_pool(pool_of(scaled), now=now + 150).desired == 3  # 3 (the size at start) is in the window
    observe(scaled, "qps", 0.0, at=now + 300)
    # The recommendations of `now` left the window; only zeros remain: down to min_replicas (1, within the step).
    last = autoscale_pool(pool_of(scaled), now=now + 301)
    assert last.desired == 1
    assert Action.objects.filter(actor_type=ActorType.AUTOSCALER, params__to=1).exists()
