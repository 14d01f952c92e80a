"""Disabling a rule ends its alerts on the next pass: pending ones are dropped, firing ones resolve."""


def test_disabling_a_rule_resolves_its_firing_alert_and_drops_its_pending_one(quiet_deployment, make_rule,
                                                                               write_sample, evaluate, at,
                                                                               admin_api):
    from controlplane.alerting.models import Alert, Channel, Delivery

    Channel.objects.create(name="ops", kind="webhook", url="http://127.0.0.1:9/x")
    firing = make_rule(quiet_deployment, name="kv-firing", keep_firing_for_s=600, actions=[{"type": "notify"}])
    pending = make_rule(quiet_deployment, name="kv-pending", for_s=600)
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, at(0))
    evaluate(at(0))
    assert {a.rule.name: a.state for a in Alert.objects.all()} == {"kv-firing": "firing", "kv-pending": "pending"}
    for rule in (firing, pending):
        response = admin_api.patch(f"/api/v1/alert-rules/{rule.pk}/", {"enabled": False}, format="json")
        assert response.status_code == 200
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, at(5))
    evaluate(at(5))
    assert {a.rule.name: a.state for a in Alert.objects.all()} == {"kv-firing": "resolved", "kv-pending": "inactive"}
    assert list(Delivery.objects.order_by("id").values_list("event", flat=True)) == ["firing", "resolved"]

