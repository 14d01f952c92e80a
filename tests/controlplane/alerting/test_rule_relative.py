"""Relative mode: "QPS down 30% against the previous hour" compares the value with the same aggregation an hour
earlier (compare_to_offset_s) and the threshold is the ratio."""


def _qps_rule(make_rule, deployment):
    return make_rule(deployment, name="qps-drop", role="gateway", metric="qps", aggregation="avg", window_s=300,
                     compare_to_offset_s=3600, comparison="<", threshold=0.7)


def test_it_fires_when_qps_is_down_more_than_30_percent_from_an_hour_ago(quiet_deployment, make_rule, write_sample,
                                                                         evaluate, at):
    from controlplane.alerting.models import Alert

    _qps_rule(make_rule, quiet_deployment)
    for second in (-3600 - 200, -3600 - 100):
        write_sample(quiet_deployment, "gateway", "qps", 10.0, at(second))
    for second in (-200, -100):
        write_sample(quiet_deployment, "gateway", "qps", 6.0, at(second))
    evaluate(at(0))
    alert = Alert.objects.get()
    assert alert.state == "firing"
    assert abs(alert.value - 0.6) < 1e-9


def test_a_20_percent_drop_does_not_fire(quiet_deployment, make_rule, write_sample, evaluate, at):
    from controlplane.alerting.models import Alert

    _qps_rule(make_rule, quiet_deployment)
    write_sample(quiet_deployment, "gateway", "qps", 10.0, at(-3600 - 100))
    write_sample(quiet_deployment, "gateway", "qps", 8.0, at(-100))
    evaluate(at(0))
    assert not Alert.objects.exists()


def test_without_a_reference_hour_there_is_no_data(quiet_deployment, make_rule, write_sample, evaluate, at):
    from controlplane.alerting.models import Alert

    _qps_rule(make_rule, quiet_deployment)
    write_sample(quiet_deployment, "gateway", "qps", 1.0, at(-100))
    evaluate(at(0))
    assert not Alert.objects.exists()
