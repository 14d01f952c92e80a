"""Slack and Alertmanager v4 bodies have the shapes their receivers expect; Tandem's own Alertmanager receiver
accepts what Tandem sends."""
import json


def _deliver(deployment, make_rule, write_sample, evaluate, at, receiver, kind):
    from controlplane.alerting.models import Channel, Delivery
    from controlplane.alerting.services.notifications import delivery_send

    Channel.objects.create(name="out", kind=kind, url=receiver.url)
    make_rule(deployment, name="kv-full", actions=[{"type": "notify"}],
              annotations={"summary": "KV cache of {{ $labels.deployment }} at {{ $value }}"})
    write_sample(deployment, "decode", "kv_cache_usage_ratio", 0.97, at(0))
    evaluate(at(0))
    assert delivery_send(delivery_id=Delivery.objects.get().pk).status == "succeeded"
    return json.loads(receiver.requests[0]["body"])


def test_a_slack_channel_gets_text_and_blocks(quiet_deployment, make_rule, write_sample, evaluate, at, receiver):
    body = _deliver(quiet_deployment, make_rule, write_sample, evaluate, at, receiver, "slack")
    assert set(body) == {"text", "blocks"}
    assert body["text"].startswith("[FIRING] kv-full on demo/decode")
    assert body["blocks"][0]["type"] == "section"
    assert "KV cache of demo at 0.97" in body["blocks"][0]["text"]["text"]


def test_an_alertmanager_channel_gets_webhook_v4(quiet_deployment, make_rule, write_sample, evaluate, at, receiver):
    from controlplane.alerting.webhooks.inbound import parse_payload

    body = _deliver(quiet_deployment, make_rule, write_sample, evaluate, at, receiver, "alertmanager")
    assert body["version"] == "4" and body["status"] == "firing" and body["receiver"] == "out"
    for key in ("groupKey", "groupLabels", "commonLabels", "commonAnnotations", "externalURL", "alerts"):
        assert key in body
    alert = body["alerts"][0]
    assert alert["labels"]["alertname"] == "kv-full" and alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert alert["annotations"]["summary"] == "KV cache of demo at 0.97"
    assert alert["startsAt"].endswith("Z") and alert["fingerprint"]
    parsed = parse_payload(body)
    assert parsed.alerts[0].labels["deployment"] == "demo"
