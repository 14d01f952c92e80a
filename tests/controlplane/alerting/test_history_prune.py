"""Ended alerts and finished deliveries older than TANDEM_ALERT_HISTORY_DAYS are pruned; active ones never."""
from datetime import timedelta


def test_old_ended_alerts_and_deliveries_go_and_active_alerts_stay(quiet_deployment, make_rule, write_sample,
                                                                  evaluate, at, settings):
    from controlplane.alerting.models import Alert, AlertTransition, Channel, Delivery
    from controlplane.alerting.services.history import history_prune

    settings.TANDEM_ALERT_HISTORY_DAYS = 7
    Channel.objects.create(name="ops", kind="webhook", url="http://127.0.0.1:9/x")
    make_rule(quiet_deployment, name="kv", actions=[{"type": "notify"}])
    make_rule(quiet_deployment, name="kv-pending", for_s=3600)
    for second, value in ((0, 0.95), (5, 0.2), (10, 0.95)):
        write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", value, at(second))
        evaluate(at(second))
    # kv: one resolved alert and a firing one; kv-pending: dropped (inactive) then pending again.
    assert sorted(Alert.objects.values_list("state", flat=True)) == ["firing", "inactive", "pending", "resolved"]
    Delivery.objects.update(status="succeeded")

    assert history_prune(now=at(10) + timedelta(days=6)) == {"deliveries": 0, "alert_rows": 0}
    pruned = history_prune(now=at(10) + timedelta(days=8))
    assert pruned["deliveries"] == 3  # firing, resolved, firing again
    assert sorted(Alert.objects.values_list("state", flat=True)) == ["firing", "pending"]
    assert not AlertTransition.objects.filter(alert__state__in=["resolved", "inactive"]).exists()
