"""An advisory rule records the actions that would change the fleet as advice, changes nothing, and still notifies;
a firing that keeps firing confirms its advice; the cooldown applies to advice as to actions; the alert resolving
expires it; turning advisory off withdraws it."""
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.alerting.models import ActionAdvice, RuleActionRun
from controlplane.alerting.services.rules import rule_update
from controlplane.models import Action, Pool


@pytest.fixture
def soon():
    """soon(seconds) → a whole second of the wall clock plus seconds: advice is fresh against the real clock."""
    base = timezone.now().replace(microsecond=0)
    return lambda seconds: base + timedelta(seconds=seconds)


@pytest.fixture
def step(quiet_deployment, write_sample, evaluate, soon):
    def run(second, value):
        write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", value, soon(second))
        evaluate(soon(second))

    return run


def decode_replicas(deployment) -> int:
    return Pool.objects.get(deployment=deployment, role="decode").desired_replicas


def test_an_advisory_rule_records_the_scale_changes_nothing_and_still_notifies(quiet_deployment, make_rule, step):
    rule = make_rule(quiet_deployment, name="kv-advised", advisory=True,
                     actions=[{"type": "scale", "direction": "up", "step": 2}, {"type": "notify"}])
    step(0, 0.93)
    assert not Action.objects.filter(kind="scale").exists()
    assert decode_replicas(quiet_deployment) == 1
    assert Action.objects.filter(kind="notify", actor="kv-advised").count() == 1
    advice = ActionAdvice.objects.get()
    assert (advice.rule, advice.kind, advice.params) == (rule, "scale", {"type": "scale", "direction": "up",
                                                                         "step": 2})
    assert (advice.role, advice.basis, advice.status) == ("decode", {"replicas": 1}, "open")
    assert (advice.value, advice.comparison, advice.threshold) == (0.93, ">", 0.9)
    assert "last(kv_cache_usage_ratio[60s]) = 0.93" in advice.detail
    assert advice.reason.startswith("alert rule 'kv-advised' firing on demo/decode: last(kv_cache_usage_ratio")
    # Only the notification ran; the scale has no run row, so later passes confirm the advice.
    assert list(RuleActionRun.objects.values_list("kind", flat=True)) == ["notify"]


def test_a_firing_that_keeps_firing_confirms_its_advice_rather_than_adding_rows(quiet_deployment, make_rule, step):
    make_rule(quiet_deployment, advisory=True, actions=[{"type": "scale", "direction": "up", "step": 1}])
    for second, value in ((0, 0.93), (5, 0.95), (10, 0.97)):
        step(second, value)
    advice = ActionAdvice.objects.get()
    assert (advice.num_evaluations, advice.value, advice.status) == (3, 0.97, "open")
    assert "= 0.97" in advice.reason
    assert decode_replicas(quiet_deployment) == 1


def test_the_alert_resolving_expires_its_advice_and_the_cooldown_holds_the_next(quiet_deployment, make_rule, step):
    make_rule(quiet_deployment, advisory=True, cooldown_s=120,
              actions=[{"type": "scale", "direction": "up", "step": 1}])
    step(0, 0.95)    # fires: advice
    step(10, 0.1)    # resolves: the advice expires
    first = ActionAdvice.objects.get()
    assert first.status == "expired" and "the alert resolved" in first.outcome
    step(20, 0.95)   # fires again within the cooldown: no advice
    assert ActionAdvice.objects.count() == 1
    step(125, 0.95)  # the cooldown has passed and this firing has not advised yet: it advises now
    assert ActionAdvice.objects.count() == 2
    assert ActionAdvice.objects.filter(status="open").count() == 1
    assert not Action.objects.filter(kind="scale").exists()


def test_a_pool_scaled_under_open_advice_supersedes_it_with_advice_for_the_new_size(quiet_deployment, make_rule,
                                                                                     step, operator):
    from controlplane.services import pool_scale

    make_rule(quiet_deployment, advisory=True, actions=[{"type": "scale", "direction": "up", "step": 1}])
    step(0, 0.95)
    pool_scale(deployment=quiet_deployment, role="decode", replicas=2, actor=operator, reason="by hand")
    step(5, 0.95)
    old, new = ActionAdvice.objects.order_by("id")
    assert old.status == "superseded" and "its target changed" in old.outcome
    assert (new.status, new.basis) == ("open", {"replicas": 2})


def test_turning_advisory_off_withdraws_open_advice_and_the_rule_acts_again(quiet_deployment, make_rule, step):
    rule = make_rule(quiet_deployment, advisory=True, actions=[{"type": "scale", "direction": "up", "step": 1}])
    step(0, 0.95)
    rule_update(rule=rule, advisory=False)
    advice = ActionAdvice.objects.get()
    assert advice.status == "superseded" and advice.outcome == "superseded: the rule's advisory mode was turned off"
    step(5, 0.95)
    assert decode_replicas(quiet_deployment) == 2


def test_a_rule_without_advisory_acts_as_before(quiet_deployment, make_rule, step):
    make_rule(quiet_deployment, actions=[{"type": "scale", "direction": "up", "step": 1}])
    step(0, 0.95)
    assert decode_replicas(quiet_deployment) == 2 and not ActionAdvice.objects.exists()


def test_advice_is_bounded_per_rule(quiet_deployment, make_rule, step, monkeypatch):
    from controlplane.alerting.services import advice

    monkeypatch.setattr(advice, "KEPT_PER_RULE", 2)
    make_rule(quiet_deployment, advisory=True, actions=[{"type": "scale", "direction": "up", "step": 1}])
    for second in (0, 10, 20, 30, 40, 50):
        step(second, 0.95 if second % 20 == 0 else 0.1)  # fires, resolves, fires, ...: a new advice each firing
    assert ActionAdvice.objects.count() == 2
