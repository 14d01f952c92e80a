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
