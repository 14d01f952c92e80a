"""Delivery failures: a permanent error (410) disables the channel and says so; a transient one (500) is tried
three times with backoff and recorded."""


def _firing_delivery(deployment, make_rule, write_sample, evaluate, at, url):
    from controlplane.alerting.models import Channel, Delivery

    Channel.objects.create(name="ops", kind="slack", url=url)
    make_rule(deployment, actions=[{"type": "notify"}])
    write_sample(deployment, "decode", "kv_cache_usage_ratio", 0.97, at(0))
    evaluate(at(0))
    return Delivery.objects.get()


def test_a_410_disables_the_channel_and_says_so(quiet_deployment, make_rule, write_sample, evaluate, at, receiver,
                                                admin_api):
    from controlplane.alerting.models import Channel
    from controlplane.alerting.services.notifications import delivery_send

    receiver.status = 410
    delivery = _firing_delivery(quiet_deployment, make_rule, write_sample, evaluate, at, receiver.url)
    delivery = delivery_send(delivery_id=delivery.pk)
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("failed", 1, 410)
    assert "permanent" in delivery.error and "channel disabled" in delivery.error
    channel = Channel.objects.get(name="ops")
    assert channel.enabled is False
    assert "HTTP 410" in channel.disabled_reason
    assert len(receiver.requests) == 1
    listed = admin_api.get("/api/v1/channels/").json()[0]
    assert listed["enabled"] is False and "410" in listed["disabled_reason"]
    deliveries = admin_api.get("/api/v1/deliveries/?status=failed").json()["results"]
    assert [d["response_code"] for d in deliveries] == [410]
    enabled = admin_api.patch(f"/api/v1/channels/{channel.pk}/", {"enabled": True}, format="json")
    assert enabled.status_code == 200
    assert enabled.json()["enabled"] is True and enabled.json()["disabled_reason"] == ""


def test_a_500_is_tried_three_times_then_recorded_as_failed(quiet_deployment, make_rule, write_sample, evaluate, at,
                                                            receiver):
    from controlplane.alerting.models import Channel
    from controlplane.alerting.services.notifications import delivery_send

    receiver.status = 500
    delivery = _firing_delivery(quiet_deployment, make_rule, write_sample, evaluate, at, receiver.url)
    delivery = delivery_send(delivery_id=delivery.pk)
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("failed", 3, 500)
    assert "gave up after 3 tries" in delivery.error
    assert len(receiver.requests) == 3
    assert Channel.objects.get(name="ops").enabled is True


def test_an_unreachable_receiver_is_transient(quiet_deployment, make_rule, write_sample, evaluate, at):
    from tests.procs import free_port

    from controlplane.alerting.models import Channel
    from controlplane.alerting.services.notifications import delivery_send

    url = f"http://127.0.0.1:{free_port()}/nobody-listens"
    delivery = _firing_delivery(quiet_deployment, make_rule, write_sample, evaluate, at, url)
    delivery = delivery_send(delivery_id=delivery.pk)
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("failed", 3, None)
    assert "connection failed" in delivery.error
    assert Channel.objects.get(name="ops").enabled is True
