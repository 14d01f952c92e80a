"""A firing alert resolves when its condition stops holding; a later episode is a new alert."""
from tests.controlplane.alerting.conftest import states


def test_a_firing_alert_resolves_and_a_new_episode_is_a_new_alert(quiet_deployment, make_rule, write_sample,
                                                                   evaluate, at):
    from controlplane.alerting.models import Alert

    rule = make_rule(quiet_deployment, for_s=5)
    for second, value in ((0, 0.95), (5, 0.95), (10, 0.2)):
        write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", value, at(second))
        evaluate(at(second))
    first = Alert.objects.get(rule=rule)
    assert (first.state, first.fired_at, first.resolved_at) == ("resolved", at(5), at(10))
    assert first.value == 0.2

    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.99, at(20))
    evaluate(at(20))
    second = Alert.objects.filter(rule=rule).exclude(pk=first.pk).get()
    assert second.state == "pending"
    assert second.fingerprint == first.fingerprint  # same label set, new episode
    assert states(rule) == [("inactive", "pending"), ("pending", "firing"), ("firing", "resolved"),
                            ("inactive", "pending")]


def test_an_alert_whose_series_disappears_resolves(quiet_deployment, make_rule, write_sample, evaluate, at):
    from controlplane.alerting.models import Alert

    rule = make_rule(quiet_deployment, window_s=10)
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, at(0))
    evaluate(at(0))
    evaluate(at(30))  # no sample in (20, 30]: no data, which does not hold
    assert Alert.objects.get(rule=rule).state == "resolved"
