"""The gateway's admission queue as an autoscaler signal, one evaluation at a time over stored series: a P99 queue wait
over the policy's target scales the pool that bounds admission out even while its own metric looks fine, requests
waiting in the queue keep it from shrinking, and without a target the queue is not read."""
import time

import pytest

from controlplane.autoscaling.autoscaler import autoscale_pool, policy_for
from controlplane.autoscaling.models import AutoscalingPolicy
from controlplane.models import Action, ActorType
from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Sample
from controlplane.services import pool_scale
from tests.controlplane.autoscaling.support import pool_of


def set_queue_target(deployment, role, seconds):
    policy = policy_for(pool_of(deployment, role))
    AutoscalingPolicy.objects.filter(pk=policy.pk).update(queue_wait_target=seconds)


def observe(deployment, metric, value, *, role, at):
    Sample.objects.create(ts=at, deployment_id=deployment.pk, role=role, worker_id=None, metric=METRIC_IDS[metric],
                          value=value)


def gateway_queue(deployment, *, wait_p99, num_queued, at):
    observe(deployment, "queue_wait_p99_seconds", wait_p99, role="gateway", at=at)
    observe(deployment, "queue_length", num_queued, role="gateway", at=at)


def autoscaler_actions(deployment):
    return Action.objects.filter(deployment=deployment, kind="scale", actor_type=ActorType.AUTOSCALER)


def test_a_queue_wait_over_target_scales_decode_out_while_its_itl_is_fine(scaled):
    set_queue_target(scaled, "decode", 0.5)
    now = time.time()
    observe(scaled, "itl_p99_seconds", 0.05, role="decode", at=now - 1)  # half the 100 ms target: fine
    gateway_queue(scaled, wait_p99=2.3, num_queued=4, at=now - 1)
    decision = autoscale_pool(pool_of(scaled), now=now)
    assert decision.desired == 3  # ceil(1 × 4.6) = 5, within the step of ±2 from 1
    [action] = autoscaler_actions(scaled)
    assert action.params == {"role": "decode", "from": 1, "to": 3}
    assert "queue wait P99 2.3 s > target 0.5 s: ceil(1 × 4.600) = 5" in action.reason
    assert "itl_p99_seconds 0.05 vs target 0.1" in action.reason
    policy = AutoscalingPolicy.objects.get(pool__deployment=scaled, pool__role="decode")
    assert "queue wait P99 2.3 s > target 0.5 s" in policy.last_decision


def test_without_a_target_the_queue_is_not_read(scaled):
    now = time.time()
    observe(scaled, "itl_p99_seconds", 0.05, role="decode", at=now - 1)
    gateway_queue(scaled, wait_p99=2.3, num_queued=4, at=now - 1)
    decision = autoscale_pool(pool_of(scaled), now=now)
    assert decision.desired == 1 and "queue wait" not in decision.reason
    assert not autoscaler_actions(scaled).exists()


def test_a_queue_wait_within_target_leaves_the_size_to_the_pool_metric(scaled):
    set_queue_target(scaled, "decode", 0.5)
    now = time.time()
    observe(scaled, "itl_p99_seconds", 0.105, role="decode", at=now - 1)
    gateway_queue(scaled, wait_p99=0.3, num_queued=0, at=now - 1)
    decision = autoscale_pool(pool_of(scaled), now=now)
    assert not decision.changes and "queue wait P99 0.3 s <= target 0.5 s" in decision.reason


def test_a_queue_wait_scales_out_even_without_data_from_the_workers(scaled):
    set_queue_target(scaled, "decode", 0.5)
    now = time.time()
    gateway_queue(scaled, wait_p99=0.9, num_queued=1, at=now - 1)  # no ITL sample at all
    decision = autoscale_pool(pool_of(scaled), now=now)
    assert decision.desired == 2 and "itl_p99_seconds: no data in the window" in decision.reason


def test_the_pool_does_not_shrink_while_requests_wait_in_the_queue(scaled, operator, settings):
    settings.TANDEM_AUTOSCALE_MANUAL_PAUSE_S = 0  # the setup scale below must not pause the test
    pool_scale(deployment=scaled, role="decode", replicas=3, actor=operator)
    set_queue_target(scaled, "decode", 0.5)
    now = time.time()
    for at in (now - 1, now + 150, now + 300):
        observe(scaled, "qps", 0.0, role="decode", at=at)  # the workers look idle: latency read as 0
        gateway_queue(scaled, wait_p99=0.1, num_queued=2, at=at)  # under target, but requests wait
    assert autoscale_pool(pool_of(scaled), now=now).desired == 3  # the down window just started
    assert autoscale_pool(pool_of(scaled), now=now + 150).desired == 3  # 3 (the size at start) is in the window
    held = autoscale_pool(pool_of(scaled), now=now + 301)  # only zeros remain in the window: it would shrink
    assert held.desired == 3 and held.raw == 0
    assert "no scale-in while 2 requests wait in the gateway's admission queue" in held.reason
    assert not autoscaler_actions(scaled).exists()
    gateway_queue(scaled, wait_p99=0.1, num_queued=0, at=now + 302)  # the queue drained
    assert autoscale_pool(pool_of(scaled), now=now + 303).desired == 1


def test_the_prefill_pool_never_reads_the_queue(scaled, make_worker):
    make_worker(scaled, "prefill")
    AutoscalingPolicy.objects.filter(pk=policy_for(pool_of(scaled, "prefill")).pk).update(queue_wait_target=0.5)
    now = time.time()
    observe(scaled, "ttft_p99_seconds", 1.0, role="prefill", at=now - 1)  # on target
    gateway_queue(scaled, wait_p99=5.0, num_queued=9, at=now - 1)
    decision = autoscale_pool(pool_of(scaled, "prefill"), now=now)
    assert decision.desired == 1 and "queue wait" not in decision.reason


def test_a_colocated_pool_scales_out_on_the_queue_wait(make_deployment, make_worker):
    solo = make_deployment("solo", mode="colocated")
    solo.autoscale_enabled = True
    solo.save()
    make_worker(solo, "colocated")
    set_queue_target(solo, "colocated", 1.0)
    now = time.time()
    observe(solo, "ttft_p99_seconds", 0.5, role="colocated", at=now - 1)  # under its 1 s target
    gateway_queue(solo, wait_p99=1.5, num_queued=3, at=now - 1)
    decision = autoscale_pool(pool_of(solo, "colocated"), now=now)
    assert decision.desired == 2 and "queue wait P99 1.5 s > target 1 s" in decision.reason
