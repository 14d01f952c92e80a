"""A firing rule scales its pool through pool_scale: an Action row with the rule as actor and the value in the
reason, once per firing."""


def test_a_firing_rule_scales_its_pool_up_once_per_firing(quiet_deployment, make_rule, write_sample, evaluate, at):
    from controlplane.alerting.models import RuleActionRun
    from controlplane.models import Action, Pool

    make_rule(quiet_deployment, name="decode-kv-full", for_s=10,
                     actions=[{"type": "scale", "direction": "up", "step": 2}])
    for second in (0, 5, 10, 15, 20):
        write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.93, at(second))
        evaluate(at(second))
    actions = list(Action.objects.filter(kind="scale", actor_type="rule"))
    assert len(actions) == 1
    action = actions[0]
    assert action.actor == "decode-kv-full"
    assert action.params == {"role": "decode", "from": 1, "to": 3}
    assert "last(kv_cache_usage_ratio[60s]) = 0.93" in action.reason
    assert "> 0.9" in action.reason
    assert Pool.objects.get(deployment=quiet_deployment, role="decode").desired_replicas == 3
    run = RuleActionRun.objects.get()
    assert run.status == "done" and run.action_id == action.pk
    assert run.idempotency_key == action.idempotency_key


def test_scaling_stops_at_the_pools_max_and_says_why(quiet_deployment, make_rule, write_sample, evaluate, at):
    from controlplane.alerting.models import RuleActionRun
    from controlplane.models import Action, Pool

    Pool.objects.filter(deployment=quiet_deployment, role="decode").update(desired_replicas=8)
    make_rule(quiet_deployment, actions=[{"type": "scale", "direction": "up", "step": 1}])
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.99, at(0))
    evaluate(at(0))
    assert not Action.objects.filter(kind="scale").exists()
    run = RuleActionRun.objects.get()
    assert run.status == "skipped"
    assert "already at its max (8 replicas)" in run.error
