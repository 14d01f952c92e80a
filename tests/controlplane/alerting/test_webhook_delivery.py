"""A firing alert reaches a real local HTTP receiver with a valid Tandem-Signature; both secrets of a rotation
verify; the resolve is delivered too."""
import json

SECRETS = ["new-secret-abcdef0123", "old-secret-0123456789"]


def test_a_firing_alert_reaches_the_receiver_signed_and_then_its_resolve(
        quiet_deployment, make_rule, write_sample, evaluate, at, receiver, django_capture_on_commit_callbacks):
    from controlplane.alerting.models import Channel, Delivery
    from controlplane.alerting.services.notifications import delivery_send
    from controlplane.alerting.webhooks.signing import verify_signature

    Channel.objects.create(name="ops", kind="webhook", url=receiver.url, secrets=SECRETS)
    make_rule(quiet_deployment, name="kv-full", actions=[{"type": "notify", "channels": ["ops"]}])
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.97, at(0))
    with django_capture_on_commit_callbacks() as callbacks:
        evaluate(at(0))
    delivery = Delivery.objects.get()
    assert len(callbacks) == 1  # the delivery task is enqueued after commit
    delivery = delivery_send(delivery_id=delivery.pk)
    assert (delivery.status, delivery.attempts, delivery.response_code) == ("succeeded", 1, 200)

    request = receiver.requests[0]
    header = request["headers"]["Tandem-Signature"]
    assert verify_signature(header, request["body"], [SECRETS[0]])
    assert verify_signature(header, request["body"], [SECRETS[1]])  # a receiver still on the old secret
    assert not verify_signature(header, request["body"], ["not-the-secret-xxxxxx"])
    body = json.loads(request["body"])
    assert body["event"] == "firing"
    assert body["alert"]["rule"] == "kv-full" and body["alert"]["value"] == 0.97
    assert body["alert"]["labels"]["deployment"] == "demo"

    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.1, at(5))
    evaluate(at(5))
    resolved = Delivery.objects.get(event="resolved")
    assert delivery_send(delivery_id=resolved.pk).status == "succeeded"
    assert json.loads(receiver.requests[1]["body"])["alert"]["state"] == "resolved"
