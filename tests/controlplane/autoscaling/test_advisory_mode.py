"""Advisory mode, one evaluation at a time: the autoscaler decides as in active mode on the same inputs, and records
that decision as advice instead of scaling; a repeated decision confirms the advice, another one supersedes it."""
import time

import pytest

from controlplane.autoscaling.autoscaler import autoscale_pool, autoscale_pools
from controlplane.autoscaling.models import AutoscalingPolicy, ScaleAdvice
from controlplane.autoscaling.services import autoscaling_update
from controlplane.models import Action, Pool, Worker
from tests.controlplane.autoscaling.support import advisory, observe, pool_of


def test_it_records_the_scale_it_would_make_and_changes_no_pool(scaled, operator):
    advisory(scaled, operator)
    observe(scaled, "itl_p99_seconds", 0.5)  # default decode target: 100 ms
    decision = autoscale_pool(pool_of(scaled), now=time.time())
    assert decision.desired == 3  # ceil(1 × 5) = 5, capped by the step of ±2
    [advice] = ScaleAdvice.objects.all()
    assert (advice.from_replicas, advice.to_replicas, advice.status, advice.raw) == (1, 3, "open", 5)
    assert (advice.metric, advice.observed, advice.target) == ("itl_p99_seconds", 0.5, 0.1)
    assert advice.ratio == pytest.approx(5.0)
    assert advice.inputs["num_ready"] == 1 and advice.inputs["max_step"] == 2 and advice.inputs["step_base"] == 1
    assert "step ±2 from 1" in advice.reason and "→ 3 replicas (was 1)" in advice.reason
    assert pool_of(scaled).desired_replicas == 1
    assert not Action.objects.filter(kind="scale").exists()
    assert Worker.objects.filter(deployment=scaled, role="decode").count() == 1
    policy = AutoscalingPolicy.objects.get(pool__deployment=scaled, pool__role="decode")
    assert f"advice #{advice.pk}; advisory mode, not applied" in policy.last_decision


def test_under_a_load_step_it_advises_in_the_evaluation_where_active_mode_scales(scaled, make_deployment,
                                                                                make_worker, operator):
    twin = make_deployment("twin")
    twin.autoscale_enabled = True
    twin.save()
    make_worker(twin, "decode")
    advisory(twin, operator)
    pools = lambda: list(Pool.objects.filter(role="decode").select_related("deployment").order_by("pk"))  # noqa: E731
    now = time.time()
    for deployment in (scaled, twin):
        observe(deployment, "itl_p99_seconds", 0.1, at=now - 1)
    assert all(not d.changes for _, d in autoscale_pools(pools(), now=now))
    assert not ScaleAdvice.objects.exists()
    for deployment in (scaled, twin):  # the load step
        observe(deployment, "itl_p99_seconds", 0.25, at=now + 4)
    decisions = {pool.deployment.name: d for pool, d in autoscale_pools(pools(), now=now + 5)}
    assert decisions["demo"].desired == decisions["twin"].desired == 3
    assert pool_of(scaled).desired_replicas == 3  # active scaled
    assert pool_of(twin).desired_replicas == 1  # advisory did not
    [advice] = ScaleAdvice.objects.all()
    assert (advice.pool.deployment, advice.from_replicas, advice.to_replicas) == (twin, 1, 3)
    [scale] = Action.objects.filter(kind="scale")
    assert scale.params["to"] == advice.to_replicas
    assert scale.reason == advice.reason  # the same inputs, the same numbers and words


def test_a_repeated_decision_confirms_the_advice_and_another_supersedes_it(scaled, operator, settings):
    settings.TANDEM_AUTOSCALE_MAX_STEP = 10  # so that a higher reading asks for more, not the same step
    advisory(scaled, operator)
    now = time.time()
    observe(scaled, "itl_p99_seconds", 0.3, at=now - 1)
    autoscale_pool(pool_of(scaled), now=now)
    autoscale_pool(pool_of(scaled), now=now + 5)
    [first] = ScaleAdvice.objects.all()
    assert (first.to_replicas, first.num_evaluations, first.status) == (3, 2, "open")
    observe(scaled, "itl_p99_seconds", 0.5, at=now + 9)
    autoscale_pool(pool_of(scaled), now=now + 10)
    first.refresh_from_db()
    second = ScaleAdvice.objects.exclude(pk=first.pk).get()
    assert (second.from_replicas, second.to_replicas, second.status) == (1, 5, "open")
    assert first.status == "superseded" and f"superseded by advice #{second.pk} (1 → 5)" in first.outcome
    observe(scaled, "itl_p99_seconds", 0.1, at=now + 14)  # back at the target: keep 1
    assert not autoscale_pool(pool_of(scaled), now=now + 15).changes
    second.refresh_from_db()
    assert second.status == "superseded" and "the autoscaler now keeps 1" in second.outcome


def test_switching_back_to_active_supersedes_the_open_advice(scaled, operator):
    advisory(scaled, operator)
    observe(scaled, "itl_p99_seconds", 0.3)
    autoscale_pool(pool_of(scaled), now=time.time())
    autoscaling_update(deployment=scaled, actor=operator, mode="active")
    advice = ScaleAdvice.objects.get()
    assert advice.status == "superseded" and "switched to active" in advice.outcome
    assert Action.objects.filter(kind="autoscale", reason__contains="mode=active").exists()


def test_it_keeps_a_bounded_number_of_rows_per_pool(scaled, operator, monkeypatch):
    from controlplane.autoscaling import advice as advice_module

    monkeypatch.setattr(advice_module, "KEPT_PER_POOL", 3)
    advisory(scaled, operator)
    now = time.time()
    for i in range(5):  # alternate readings: each evaluation changes its mind
        observe(scaled, "itl_p99_seconds", 0.3 if i % 2 == 0 else 0.2, at=now + 10 * i - 1)
        autoscale_pool(pool_of(scaled), now=now + 10 * i)
    assert ScaleAdvice.objects.count() == 3
    assert ScaleAdvice.objects.filter(status="open").count() == 1


def test_a_schedules_floor_is_advised_too_since_schedules_act_through_the_autoscaler(scaled, operator):
    from controlplane.capacity.services.schedules import schedule_create

    advisory(scaled, operator)
    schedule_create(pool=pool_of(scaled), actor=operator, name="always", cron="* * * * *", duration_minutes=1440,
                    timezone="UTC", min_replicas=4)
    autoscale_pool(pool_of(scaled), now=time.time())  # no data at all: HPA alone would keep 1
    advice = ScaleAdvice.objects.get()
    assert (advice.from_replicas, advice.to_replicas) == (1, 4) and "schedule 'always'" in advice.reason
    assert advice.inputs["bounds_why"].startswith("schedule") and pool_of(scaled).desired_replicas == 1
