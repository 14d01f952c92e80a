"""A pending alert whose condition clears before `for_s` is dropped without a resolve (Prometheus)."""
from tests.controlplane.alerting.conftest import states


def test_a_pending_alert_that_clears_is_dropped_without_firing_or_resolving(quiet_deployment, make_rule, write_sample,
                                                                             evaluate, at):
    from controlplane.alerting.models import Alert, RuleActionRun

    rule = make_rule(quiet_deployment, for_s=60, actions=[{"type": "scale", "direction": "up", "step": 1}])
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, at(0))
    evaluate(at(0))
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.5, at(5))
    evaluate(at(5))
    alert = Alert.objects.get(rule=rule)
    assert alert.state == "inactive"
    assert alert.fired_at is None and alert.resolved_at is None
    assert states(rule) == [("inactive", "pending"), ("pending", "inactive")]
    assert not RuleActionRun.objects.exists()

    # Holding again starts a new pending alert from scratch: the earlier minute does not count towards `for`.
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, at(10))
    evaluate(at(10))
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, at(65))
    evaluate(at(65))
    newest = Alert.objects.filter(rule=rule).order_by("-id").first()
    assert newest.pk != alert.pk
    assert newest.state == "pending" and newest.active_at == at(10)
