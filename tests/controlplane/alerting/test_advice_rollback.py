"""An advisory rule advises the rollback instead of rolling back; a refusal by the service when it is applied is a
409 with the service's message, and the advice stays open."""
from django.utils import timezone

from controlplane.alerting.models import ActionAdvice
from controlplane.models import Action


def advise_rollback(deployment, make_rule, write_sample, evaluate) -> ActionAdvice:
    make_rule(deployment, name="errors-after-deploy", role="gateway", metric="server_error_ratio", comparison=">",
              threshold=0.05, advisory=True, actions=[{"type": "rollback"}])
    now = timezone.now()
    write_sample(deployment, "gateway", "server_error_ratio", 0.2, now)
    evaluate(now)
    return ActionAdvice.objects.get(status="open")


def test_an_advisory_rule_advises_the_rollback_and_apply_rolls_back(quiet_deployment, second_revision, make_rule,
                                                                     write_sample, evaluate, operator_api):
    advice = advise_rollback(quiet_deployment, make_rule, write_sample, evaluate)
    quiet_deployment.refresh_from_db()
    assert quiet_deployment.current_revision.number == 2 and not Action.objects.filter(kind="rollback").exists()
    assert advice.basis == {"revision": quiet_deployment.current_revision_id}
    response = operator_api.post(f"/api/v1/alert-rules/{advice.rule_id}/advice/{advice.pk}/apply", {},
                                 format="json")
    assert response.status_code == 202, response.content
    quiet_deployment.refresh_from_db()
    assert quiet_deployment.current_revision.number == 1
    assert Action.objects.get(kind="rollback").actor == "otto-operator"


def test_a_rollback_the_service_refuses_is_a_409_and_the_advice_stays_open(quiet_deployment, make_rule,
                                                                            write_sample, evaluate, operator_api):
    advice = advise_rollback(quiet_deployment, make_rule, write_sample, evaluate)  # one revision: nothing earlier
    response = operator_api.post(f"/api/v1/alert-rules/{advice.rule_id}/advice/{advice.pk}/apply", {},
                                 format="json")
    assert response.status_code == 409
    assert response.json()["error"]["message"].startswith(f"advice #{advice.pk} was not carried out: ")
    advice.refresh_from_db()
    assert advice.status == "open" and not Action.objects.filter(kind="rollback").exists()
