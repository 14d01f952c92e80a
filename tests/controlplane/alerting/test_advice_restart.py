"""An advisory worker-down rule advises the restart of its worker instead of restarting it; applied, the worker
restarts as the operator's action; a worker restarted since makes the advice stale."""
from datetime import timedelta

from django.utils import timezone

from controlplane.alerting.models import ActionAdvice, AlertRule
from controlplane.alerting.services.rules import rule_update
from controlplane.models import Action


def advise_restart(deployment, make_worker, write_sample, evaluate):
    rule_update(rule=AlertRule.objects.get(deployment=deployment, default_key="worker-down"), advisory=True)
    sick, healthy = make_worker(deployment, "decode"), make_worker(deployment, "prefill")
    start = timezone.now() - timedelta(seconds=60)
    for second in range(0, 65, 5):
        write_sample(deployment, "decode", "up", 0.0, start + timedelta(seconds=second), worker=sick)
        write_sample(deployment, "prefill", "up", 1.0, start + timedelta(seconds=second), worker=healthy)
        evaluate(start + timedelta(seconds=second))
    return sick, ActionAdvice.objects.get(status="open")


def test_an_advisory_worker_down_rule_advises_the_restart_and_apply_restarts_it(deployment, make_worker,
                                                                                  write_sample, evaluate,
                                                                                  operator_api):
    sick, advice = advise_restart(deployment, make_worker, write_sample, evaluate)
    assert not Action.objects.filter(kind="restart").exists()
    assert Action.objects.filter(kind="notify", actor="demo:worker-down").exists()  # notifications still go
    assert (advice.kind, advice.worker_id, advice.basis) == ("restart", sick.pk,
                                                             {"worker": sick.pk, "restart_count": 0})
    response = operator_api.post(f"/api/v1/alert-rules/{advice.rule_id}/advice/{advice.pk}/apply", {},
                                 format="json")
    assert response.status_code == 202, response.content
    restart = Action.objects.get(kind="restart")
    assert (restart.worker_id, restart.actor_type, restart.actor) == (sick.pk, "user", "otto-operator")
    assert restart.reason.startswith(f"applied alert advice #{advice.pk}: alert rule 'demo:worker-down' firing")


def test_a_worker_restarted_since_makes_the_advice_stale(deployment, make_worker, write_sample, evaluate,
                                                         operator_api):
    from controlplane.models import Worker

    sick, advice = advise_restart(deployment, make_worker, write_sample, evaluate)
    Worker.objects.filter(pk=sick.pk).update(restart_count=1)  # as supervision's restart leaves it
    response = operator_api.post(f"/api/v1/alert-rules/{advice.rule_id}/advice/{advice.pk}/apply", {},
                                 format="json")
    assert response.status_code == 409 and "restart_count 0; now: worker" in response.json()["error"]["message"]
