"""keep_firing_for keeps an alert firing after its condition stops holding, then it resolves."""
from tests.controlplane.alerting.conftest import states


def test_it_keeps_firing_for_the_given_time_after_the_condition_clears(quiet_deployment, make_rule, write_sample,
                                                                        evaluate, at):
    from controlplane.alerting.models import Alert

    rule = make_rule(quiet_deployment, keep_firing_for_s=20)
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, at(0))
    evaluate(at(0))
    for second in (5, 10, 15, 20):
        write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.1, at(second))
        evaluate(at(second))
        expected = "firing" if second < 20 else "resolved"
        assert Alert.objects.get(rule=rule).state == expected, f"at {second}s"
    alert = Alert.objects.get(rule=rule)
    assert alert.resolved_at == at(20)
    assert states(rule) == [("inactive", "firing"), ("firing", "resolved")]


def test_holding_again_within_keep_firing_for_keeps_the_same_alert(quiet_deployment, make_rule, write_sample,
                                                                    evaluate, at):
    from controlplane.alerting.models import Alert

    rule = make_rule(quiet_deployment, keep_firing_for_s=20)
    for second, value in ((0, 0.95), (10, 0.1), (15, 0.95), (30, 0.1), (34, 0.1)):
        write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", value, at(second))
        evaluate(at(second))
    alert = Alert.objects.get(rule=rule)
    assert alert.state == "firing"  # last held at 15 s: keeps firing until 35 s
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.1, at(35))
    evaluate(at(35))
    assert Alert.objects.get(rule=rule).state == "resolved"
    assert states(rule) == [("inactive", "firing"), ("firing", "resolved")]
