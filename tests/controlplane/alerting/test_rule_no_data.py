"""No sample in the window is "no data": it never fires, unless the rule is an absence rule (fire_on_no_data)."""


def test_no_data_does_not_fire(quiet_deployment, make_rule, evaluate, at):
    from controlplane.alerting.models import Alert

    make_rule(quiet_deployment, comparison="<", threshold=0.5)  # 0 would hold; no data must not
    evaluate(at(0))
    assert not Alert.objects.exists()


def test_an_absence_rule_fires_on_no_data(quiet_deployment, make_rule, evaluate, at):
    from controlplane.alerting.models import Alert

    make_rule(quiet_deployment, metric="qps", role="decode", comparison=">", threshold=0, fire_on_no_data=True)
    evaluate(at(0))
    alert = Alert.objects.get()
    assert alert.state == "firing" and alert.value is None
