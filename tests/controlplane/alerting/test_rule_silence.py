"""Silences mute the notifications and actions of matching alerts; the alert itself still changes state."""
from datetime import timedelta


def test_a_silenced_alert_fires_but_does_nothing_until_the_silence_ends(quiet_deployment, make_rule, write_sample,
                                                                        evaluate, at, operator):
    from controlplane.alerting.models import Alert, Channel, Delivery
    from controlplane.alerting.services.silences import silence_create
    from controlplane.models import Action

    Channel.objects.create(name="ops", kind="webhook", url="http://127.0.0.1:9/never-called")
    make_rule(quiet_deployment, actions=[{"type": "notify"}, {"type": "scale", "direction": "up", "step": 1}])
    silence_create(matchers=[{"name": "deployment", "value": "demo"}, {"name": "role", "value": "dec.*",
                                                                         "is_regex": True}],
                   starts_at=at(-10), ends_at=at(30), comment="maintenance", created_by=operator)
    for second in (0, 10, 20):
        write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.99, at(second))
        evaluate(at(second))
    assert Alert.objects.get().state == "firing"
    assert not Action.objects.filter(actor_type="rule").exists()
    assert not Delivery.objects.exists()

    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.99, at(30))
    evaluate(at(30))  # the silence ended at 30 s: the still-firing alert acts now
    assert Action.objects.filter(actor_type="rule", kind="scale").count() == 1
    assert Delivery.objects.filter(event="firing").count() == 1


def test_a_silence_that_does_not_match_mutes_nothing(quiet_deployment, make_rule, write_sample, evaluate, at,
                                                     operator):
    from controlplane.alerting.services.silences import silence_create
    from controlplane.models import Action

    make_rule(quiet_deployment, actions=[{"type": "scale", "direction": "up", "step": 1}])
    silence_create(matchers=[{"name": "role", "value": "prefill"}], starts_at=at(-10), ends_at=at(3600),
                   comment="prefill maintenance", created_by=operator)
    silence_create(matchers=[{"name": "deployment", "value": "demo", "is_equal": False}], starts_at=at(-10),
                   ends_at=at(3600), comment="everything but demo", created_by=operator)
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.99, at(0))
    evaluate(at(0))
    assert Action.objects.filter(actor_type="rule", kind="scale").count() == 1


def test_an_expired_silence_mutes_nothing(quiet_deployment, make_rule, write_sample, evaluate, at, operator):
    from django.utils import timezone

    from controlplane.alerting.services.silences import silence_create, silence_expire
    from controlplane.models import Action

    make_rule(quiet_deployment, actions=[{"type": "scale", "direction": "up", "step": 1}])
    now = timezone.now()
    silence = silence_create(matchers=[{"name": "deployment", "value": "demo"}], ends_at=now + timedelta(hours=1),
                             comment="deploy window", created_by=operator)
    silence_expire(silence=silence)
    assert silence.ends_at <= timezone.now()
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.99, now)
    evaluate(now)
    assert Action.objects.filter(actor_type="rule", kind="scale").count() == 1
