"""The default "worker down" rule restarts the worker whose scrapes fail, through worker_restart."""


def test_a_worker_whose_scrapes_fail_is_restarted_by_the_default_rule(deployment, make_worker, write_sample,
                                                                      evaluate, at):
    from controlplane.alerting.models import Alert
    from controlplane.models import Action

    sick = make_worker(deployment, "decode")
    healthy = make_worker(deployment, "prefill")
    for second in range(0, 65, 5):
        write_sample(deployment, "decode", "up", 0.0, at(second), worker=sick)
        write_sample(deployment, "prefill", "up", 1.0, at(second), worker=healthy)
        evaluate(at(second))
    alert = Alert.objects.get(rule__default_key="worker-down", state="firing")
    assert alert.worker_id == sick.pk and alert.labels["worker"] == str(sick.pk)
    restart = Action.objects.get(kind="restart")
    assert restart.worker_id == sick.pk
    assert (restart.actor_type, restart.actor) == ("rule", "demo:worker-down")
    assert "max(up[30s]) = 0" in restart.reason
    assert not Alert.objects.filter(worker=healthy).exists()


def test_a_worker_without_any_sample_is_not_restarted(deployment, make_worker, evaluate, at):
    from controlplane.models import Action

    make_worker(deployment, "decode")  # not scraped yet: no data, which is not "down"
    for second in range(0, 65, 5):
        evaluate(at(second))
    assert not Action.objects.filter(kind="restart").exists()


def test_when_the_rule_fires_for_much_of_the_fleet_at_once_its_restarts_are_held(
        deployment, make_worker, write_sample, evaluate, at, settings):
    """Every worker's `up` at 0 at once is the scraper's (or Prometheus') failure more likely than the fleet's:
    the restarts are held (recorded as skipped, with why), the notifications still go."""
    from controlplane.alerting.models import Alert, RuleActionRun
    from controlplane.models import Action

    settings.TANDEM_HEALTH_HOLD_PCT, settings.TANDEM_HEALTH_HOLD_MIN = 10, 3
    workers = [make_worker(deployment, "decode") for _ in range(3)] + [make_worker(deployment, "prefill")]
    for second in range(0, 65, 5):
        for worker in workers:
            write_sample(deployment, worker.role, "up", 0.0, at(second), worker=worker)
        evaluate(at(second))
    assert Alert.objects.filter(rule__default_key="worker-down", state="firing").count() == 4
    assert not Action.objects.filter(kind="restart").exists()
    held = RuleActionRun.objects.filter(kind="restart")
    assert held.count() == 4 and {run.status for run in held} == {"skipped"}
    assert held[0].error.startswith("held: rules on up are pending or firing for 4 workers at once (4 ready)")
    assert RuleActionRun.objects.filter(kind="notify", status="done").count() == 4
