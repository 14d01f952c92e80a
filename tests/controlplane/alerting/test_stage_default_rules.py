"""The per-stage default rules, evaluated for real over stored series: prefill TTFT P99 over its objective, decode
ITL P99 over its objective, decode tokens/s down 30% against the previous hour, KV usage over 90% for 5 minutes
(which scales that pool up, within max_replicas). Thresholds follow the deployment's objectives."""
from __future__ import annotations

import pytest


def stage_rules(deployment, *keys):
    """The deployment's default rules named by `keys`; every other rule is disabled, so it alone is evaluated."""
    from controlplane.alerting.models import AlertRule

    AlertRule.objects.filter(deployment=deployment).exclude(default_key__in=keys).update(enabled=False)
    return {r.default_key: r for r in AlertRule.objects.filter(deployment=deployment, default_key__in=keys)}


def alert_of(rule):
    from controlplane.alerting.models import Alert

    return Alert.objects.filter(rule=rule).order_by("-id").first()


def test_each_stage_rule_reads_its_own_pool_in_either_mode(deployment, make_deployment):
    from controlplane.alerting.models import AlertRule

    split = {r.default_key: r for r in AlertRule.objects.filter(deployment=deployment)}
    assert (split["prefill-ttft"].metric, split["prefill-ttft"].role) == ("ttft_p99_seconds", "prefill")
    assert (split["decode-itl"].metric, split["decode-itl"].role) == ("itl_p99_seconds", "decode")
    drop = split["decode-tokens-drop"]
    assert (drop.metric, drop.role, drop.compare_to_offset_s, drop.comparison, drop.threshold) == (
        "generation_tokens_per_second", "decode", 3600, "<", 0.7)
    kv = split["kv-usage"]
    assert (kv.metric, kv.role, kv.threshold, kv.for_s) == ("kv_cache_usage_ratio", "", 0.9, 300)
    assert kv.actions[0] == {"type": "scale", "direction": "up", "step": 1}
    together = {r.default_key: r for r in AlertRule.objects.filter(deployment=make_deployment("one", mode="colocated"))}
    assert {together[k].role for k in ("prefill-ttft", "decode-itl", "decode-tokens-drop")} == {"colocated"}


def test_thresholds_start_at_the_objectives_given_at_create(make_deployment):
    from controlplane.alerting.models import AlertRule

    deployment = make_deployment("slo", objectives={"ttft_p99_seconds": 2.5})
    rules = {r.default_key: r for r in AlertRule.objects.filter(deployment=deployment)}
    assert rules["prefill-ttft"].threshold == 2.5
    assert rules["decode-itl"].threshold == 1.0  # the default objective
    assert rules["p99-latency"].threshold == 60.0


def test_changing_an_objective_moves_the_threshold_of_the_rule_that_follows_it(deployment, operator):
    from controlplane.alerting.models import AlertRule
    from controlplane.services import deployment_objectives_set

    deployment_objectives_set(deployment=deployment, objectives={"itl_p99_seconds": 0.25}, actor=operator)
    rules = {r.default_key: r for r in AlertRule.objects.filter(deployment=deployment)}
    assert rules["decode-itl"].threshold == 0.25
    assert rules["prefill-ttft"].threshold == 10.0
    assert rules["decode-itl"].describe() == "last(itl_p99_seconds[60s]) > 0.25"


def test_prefill_ttft_over_its_objective_fires_after_a_minute(deployment, operator, write_sample, evaluate, at):
    from controlplane.services import deployment_objectives_set

    deployment_objectives_set(deployment=deployment, objectives={"ttft_p99_seconds": 2.0}, actor=operator)
    rule = stage_rules(deployment, "prefill-ttft")["prefill-ttft"]
    # The gateway's TTFT and the decode pool's do not count: this is the prefill stage's rule.
    write_sample(deployment, "gateway", "ttft_p99_seconds", 9.0, at(0))
    write_sample(deployment, "decode", "ttft_p99_seconds", 9.0, at(0))
    write_sample(deployment, "prefill", "ttft_p99_seconds", 1.5, at(0))
    evaluate(at(0))
    assert alert_of(rule) is None
    for second in (5, 35, 65):
        write_sample(deployment, "prefill", "ttft_p99_seconds", 2.4, at(second))
        evaluate(at(second))
    alert = alert_of(rule)
    assert (alert.state, alert.role, alert.value) == ("firing", "prefill", 2.4)
    assert "over its objective" in alert.annotations["summary"]


def test_decode_itl_over_its_objective_fires_on_the_decode_pool(deployment, write_sample, evaluate, at):
    rule = stage_rules(deployment, "decode-itl")["decode-itl"]
    write_sample(deployment, "prefill", "itl_p99_seconds", 3.0, at(0))
    write_sample(deployment, "decode", "itl_p99_seconds", 0.9, at(0))
    evaluate(at(0))
    assert alert_of(rule) is None  # the default objective is 1 s
    write_sample(deployment, "decode", "itl_p99_seconds", 1.3, at(10))
    evaluate(at(10))
    assert (alert_of(rule).state, alert_of(rule).role) == ("pending", "decode")
    write_sample(deployment, "decode", "itl_p99_seconds", 1.3, at(70))
    evaluate(at(70))
    assert alert_of(rule).state == "firing"


def test_decode_tokens_per_second_down_30_percent_against_the_previous_hour(deployment, write_sample, evaluate, at):
    rule = stage_rules(deployment, "decode-tokens-drop")["decode-tokens-drop"]
    for second in range(-3600 - 590, -3600, 30):
        write_sample(deployment, "decode", "generation_tokens_per_second", 50.0, at(second))
    for second in range(-590, 1, 30):
        write_sample(deployment, "decode", "generation_tokens_per_second", 30.0, at(second))
    evaluate(at(0))
    alert = alert_of(rule)
    assert alert.state == "pending" and alert.value == pytest.approx(0.6)
    for second in range(30, 301, 30):
        write_sample(deployment, "decode", "generation_tokens_per_second", 30.0, at(second))
    evaluate(at(300))
    assert alert_of(rule).state == "firing"


def test_decode_tokens_per_second_without_data_an_hour_ago_does_not_fire(deployment, write_sample, evaluate, at):
    rule = stage_rules(deployment, "decode-tokens-drop")["decode-tokens-drop"]
    for second in range(-590, 301, 30):  # a deployment younger than an hour: nothing to compare with
        write_sample(deployment, "decode", "generation_tokens_per_second", 1.0, at(second))
        evaluate(at(second))
    assert alert_of(rule) is None


def test_kv_usage_over_90_percent_for_5_minutes_scales_that_pool_up(deployment, write_sample, evaluate, at):
    from controlplane.models import Action, Pool

    rule = stage_rules(deployment, "kv-usage")["kv-usage"]
    for second in range(0, 300, 15):
        write_sample(deployment, "decode", "kv_cache_usage_ratio", 0.95, at(second))
        write_sample(deployment, "prefill", "kv_cache_usage_ratio", 0.2, at(second))
        evaluate(at(second))
    assert alert_of(rule).state == "pending"  # 4 min 45 s above 90%: not yet
    assert not Action.objects.filter(kind="scale").exists()
    write_sample(deployment, "decode", "kv_cache_usage_ratio", 0.95, at(300))
    evaluate(at(300))
    assert (alert_of(rule).state, alert_of(rule).role) == ("firing", "decode")
    action = Action.objects.get(kind="scale", actor_type="rule")
    assert action.actor == "demo:kv-usage" and action.params == {"role": "decode", "from": 1, "to": 2}
    assert Pool.objects.get(deployment=deployment, role="decode").desired_replicas == 2
    assert Pool.objects.get(deployment=deployment, role="prefill").desired_replicas == 1


def test_a_dip_under_90_percent_restarts_the_5_minutes(deployment, write_sample, evaluate, at):
    rule = stage_rules(deployment, "kv-usage")["kv-usage"]
    for second in range(0, 421, 15):
        value = 0.85 if second == 180 else 0.95  # one scrape under 90% three minutes in
        write_sample(deployment, "decode", "kv_cache_usage_ratio", value, at(second))
        evaluate(at(second))
    # min over the last 60 s saw the dip until 240 s; the condition holds again from 255 s, so 420 s is too early.
    assert alert_of(rule).state == "pending"


def test_kv_usage_without_samples_does_not_fire(deployment, evaluate, at):
    rule = stage_rules(deployment, "kv-usage")["kv-usage"]
    for second in range(0, 601, 60):
        evaluate(at(second))
    assert alert_of(rule) is None


def test_kv_usage_at_max_replicas_does_not_scale_and_says_why(deployment, write_sample, evaluate, at):
    from controlplane.alerting.models import RuleActionRun
    from controlplane.models import Action, Pool

    Pool.objects.filter(deployment=deployment, role="decode").update(desired_replicas=8, max_replicas=8)
    stage_rules(deployment, "kv-usage")
    for second in range(0, 301, 30):
        write_sample(deployment, "decode", "kv_cache_usage_ratio", 0.97, at(second))
        evaluate(at(second))
    assert not Action.objects.filter(kind="scale").exists()
    run = RuleActionRun.objects.filter(status="skipped").get()
    assert "already at its max (8 replicas)" in run.error
