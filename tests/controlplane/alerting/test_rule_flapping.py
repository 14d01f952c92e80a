"""A metric that flaps around its threshold produces a bounded number of actions."""
import math


def test_a_flapping_metric_scales_at_most_once_per_cooldown(quiet_deployment, make_rule, write_sample, evaluate,
                                                            at):
    from controlplane.alerting.models import Alert, Channel
    from controlplane.models import Action, Pool

    Channel.objects.create(name="ops", kind="webhook", url="http://127.0.0.1:9/never-called")
    Pool.objects.filter(deployment=quiet_deployment, role="decode").update(max_replicas=64)
    make_rule(quiet_deployment, cooldown_s=60,
              actions=[{"type": "scale", "direction": "up", "step": 1}, {"type": "notify"}])
    duration_s, interval_s = 300, 5
    for second in range(0, duration_s, interval_s):
        value = 0.95 if (second // interval_s) % 2 == 0 else 0.85  # above, below, above, ... every evaluation
        write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", value, at(second))
        evaluate(at(second))

    num_firings = Alert.objects.filter(fired_at__isnull=False).count()
    assert num_firings == duration_s // interval_s // 2  # it really flapped: 30 firings
    bound = math.ceil(duration_s / 60)
    num_scales = Action.objects.filter(kind="scale").count()
    num_notifies = Action.objects.filter(kind="notify", params__event="firing").count()
    assert 1 <= num_scales <= bound
    assert 1 <= num_notifies <= bound
