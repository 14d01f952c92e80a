"""A rule with a rollback action rolls the deployment back to its previous revision through deployment_rollback;
a refusal by the service is recorded on the run, not raised."""


def test_a_firing_rule_rolls_the_deployment_back(quiet_deployment, second_revision, make_rule, write_sample,
                                                 evaluate, at):
    from controlplane.alerting.models import RuleActionRun
    from controlplane.models import Action

    make_rule(quiet_deployment, name="errors-after-deploy", role="gateway", metric="server_error_ratio",
              comparison=">", threshold=0.05, actions=[{"type": "rollback"}])
    write_sample(quiet_deployment, "gateway", "server_error_ratio", 0.2, at(0))
    evaluate(at(0))
    action = Action.objects.get(kind="rollback")
    assert (action.actor_type, action.actor) == ("rule", "errors-after-deploy")
    assert action.params["from_revision"] == 2 and action.params["to_revision"] == 1
    assert "last(server_error_ratio[60s]) = 0.2 > 0.05" in action.reason
    quiet_deployment.refresh_from_db()
    assert quiet_deployment.current_revision.number == 1
    assert RuleActionRun.objects.get().status == "done"


def test_a_refused_rollback_is_recorded_with_the_services_message(quiet_deployment, make_rule, write_sample,
                                                                 evaluate, at):
    from controlplane.alerting.models import RuleActionRun
    from controlplane.models import Action

    make_rule(quiet_deployment, role="gateway", metric="server_error_ratio", comparison=">", threshold=0.05,
              actions=[{"type": "rollback"}])
    write_sample(quiet_deployment, "gateway", "server_error_ratio", 0.2, at(0))
    evaluate(at(0))  # revision 1 is the only one: nothing to roll back to
    assert not Action.objects.filter(kind="rollback").exists()
    run = RuleActionRun.objects.get()
    assert run.status == "failed"
    assert "no revision before 1" in run.error
    write_sample(quiet_deployment, "gateway", "server_error_ratio", 0.2, at(5))
    evaluate(at(5))
    assert RuleActionRun.objects.count() == 1  # once per firing, refused or not
