"""A rule's condition must hold for `for_s` before its alert fires (pending until then)."""
from tests.controlplane.alerting.conftest import states


def test_it_is_pending_until_the_condition_held_for_its_duration_then_fires(quiet_deployment, make_rule,
                                                                             write_sample, evaluate, at):
    from controlplane.alerting.models import Alert

    rule = make_rule(quiet_deployment, for_s=30)
    for second in (0, 10, 20):
        write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, at(second))
        evaluate(at(second))
        alert = Alert.objects.get(rule=rule)
        assert alert.state == "pending", f"at {second}s"
        assert alert.value == 0.95
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.97, at(30))
    evaluate(at(30))
    alert = Alert.objects.get(rule=rule)
    assert alert.state == "firing"
    assert alert.active_at == at(0) and alert.fired_at == at(30)
    assert alert.labels == {"alertname": rule.name, "severity": "warning", "deployment": "demo", "role": "decode"}
    assert states(rule) == [("inactive", "pending"), ("pending", "firing")]


def test_a_rule_without_for_fires_on_the_first_evaluation(quiet_deployment, make_rule, write_sample, evaluate, at):
    rule = make_rule(quiet_deployment, for_s=0)
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, at(0))
    evaluate(at(0))
    assert states(rule) == [("inactive", "firing")]


def test_a_value_on_the_threshold_does_not_hold_for_a_strict_comparison(quiet_deployment, make_rule, write_sample,
                                                                         evaluate, at):
    rule = make_rule(quiet_deployment, comparison=">", threshold=0.9)
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.9, at(0))
    evaluate(at(0))
    assert states(rule) == []
