"""Cooldown per rule and target: a second firing within cooldown_s does not act again; after it, it does."""


def test_a_second_firing_within_the_cooldown_does_not_scale_again(quiet_deployment, make_rule, write_sample,
                                                                   evaluate, at):
    from controlplane.models import Action

    make_rule(quiet_deployment, cooldown_s=120, actions=[{"type": "scale", "direction": "up", "step": 1}])

    def step(second, value):
        write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", value, at(second))
        evaluate(at(second))

    step(0, 0.95)    # fires: scale 1 → 2
    step(10, 0.1)    # resolves
    step(20, 0.95)   # fires again within 120 s: no action
    assert Action.objects.filter(kind="scale").count() == 1
    step(110, 0.95)  # still the same firing, still within the cooldown
    assert Action.objects.filter(kind="scale").count() == 1
    step(125, 0.95)  # the cooldown has passed and this firing has not acted yet: it acts now
    scales = list(Action.objects.filter(kind="scale").order_by("id").values_list("params", flat=True))
    assert scales == [{"role": "decode", "from": 1, "to": 2}, {"role": "decode", "from": 2, "to": 3}]
    step(300, 0.95)  # the same firing never acts twice
    assert Action.objects.filter(kind="scale").count() == 2
