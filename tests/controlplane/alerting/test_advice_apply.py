"""Applying an advisory rule's advice (POST /api/v1/alert-rules/{id}/advice/{id}/apply, operators): it carries the
action out as the operator's own, audited with a reason naming the advice, once; stale advice is a 409 saying why;
viewers list advice and may not apply it."""
from datetime import timedelta

import pytest
from django.utils import timezone

from controlplane.alerting.models import ActionAdvice, RuleActionRun
from controlplane.models import Action, Pool


@pytest.fixture
def advised(quiet_deployment, make_rule, write_sample, evaluate):
    """An advisory rule whose alert fires now, with its open advice: scale decode up by 2."""
    rule = make_rule(quiet_deployment, name="kv-advised", advisory=True, cooldown_s=300,
                     actions=[{"type": "scale", "direction": "up", "step": 2}])
    now = timezone.now()
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.93, now)
    evaluate(now)
    return rule, ActionAdvice.objects.get(status="open")


def apply_url(rule, advice) -> str:
    return f"/api/v1/alert-rules/{rule.pk}/advice/{advice.pk}/apply"


def decode_replicas(deployment) -> int:
    return Pool.objects.get(deployment=deployment, role="decode").desired_replicas


def test_viewers_list_the_advice_with_its_inputs_and_margin(viewer_api, advised):
    rule, advice = advised
    response = viewer_api.get(f"/api/v1/alert-rules/{rule.pk}/advice?status=open")
    assert response.status_code == 200, response.content
    [row] = response.json()
    assert (row["id"], row["kind"], row["role"], row["status"]) == (advice.pk, "scale", "decode", "open")
    assert (row["value"], row["threshold"], row["alert_state"]) == (0.93, 0.9, "firing")
    assert row["margin"] == pytest.approx(0.03)
    assert viewer_api.get(f"/api/v1/alert-rules/{rule.pk}/advice?status=bogus").status_code == 400


def test_a_viewer_may_not_apply_advice(viewer_api, advised, quiet_deployment):
    rule, advice = advised
    assert viewer_api.post(apply_url(rule, advice), {}, format="json").status_code == 403
    assert decode_replicas(quiet_deployment) == 1


def test_apply_carries_it_out_as_the_operators_action_once(operator_api, advised, quiet_deployment):
    rule, advice = advised
    response = operator_api.post(apply_url(rule, advice), {"reason": "agreed", "idempotency_key": "k1"},
                                 format="json")
    assert response.status_code == 202, response.content
    action = Action.objects.get(kind="scale")
    assert (action.actor_type, action.actor, action.params) == ("user", "otto-operator",
                                                                {"role": "decode", "from": 1, "to": 3})
    assert action.reason.startswith(f"applied alert advice #{advice.pk}; agreed: alert rule 'kv-advised' firing")
    assert response.json()["advice"]["status"] == "applied"
    assert response.json()["advice"]["applied_by"] == "otto-operator"
    assert response.json()["action"]["id"] == action.pk
    assert decode_replicas(quiet_deployment) == 3
    # The firing's run: the rule does not advise again for it, and its cooldown counts from the apply.
    run = RuleActionRun.objects.get(kind="scale")
    assert (run.status, run.action_id) == ("done", action.pk)
    again = operator_api.post(apply_url(rule, advice), {"idempotency_key": "k1"}, format="json")
    assert again.status_code == 202 and again.json()["action"]["id"] == action.pk
    twice = operator_api.post(apply_url(rule, advice), {}, format="json")
    assert twice.status_code == 409 and "already applied by otto-operator" in twice.json()["error"]["message"]
    assert Action.objects.filter(kind="scale").count() == 1


def test_the_next_evaluation_neither_advises_nor_acts_again_for_an_applied_firing(operator_api, advised,
                                                                                   quiet_deployment, write_sample,
                                                                                   evaluate):
    rule, advice = advised
    assert operator_api.post(apply_url(rule, advice), {}, format="json").status_code == 202
    now = timezone.now() + timedelta(seconds=5)
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.95, now)
    evaluate(now)
    assert ActionAdvice.objects.count() == 1 and Action.objects.filter(kind="scale").count() == 1


def test_advice_made_for_another_pool_size_is_a_409_saying_why(operator_api, advised, quiet_deployment, operator):
    from controlplane.services import pool_scale

    rule, advice = advised
    pool_scale(deployment=quiet_deployment, role="decode", replicas=2, actor=operator, reason="by hand")
    response = operator_api.post(apply_url(rule, advice), {}, format="json")
    assert response.status_code == 409
    assert "is stale: its target changed since it was advised (replicas 1; now: replicas 2)" in \
        response.json()["error"]["message"]
    assert decode_replicas(quiet_deployment) == 2


def test_advice_whose_alert_resolved_is_a_409(operator_api, advised, quiet_deployment, write_sample, evaluate):
    rule, advice = advised
    now = timezone.now() + timedelta(seconds=5)
    write_sample(quiet_deployment, "decode", "kv_cache_usage_ratio", 0.1, now)
    evaluate(now)
    response = operator_api.post(apply_url(rule, advice), {}, format="json")
    assert response.status_code == 409
    assert "is stale: expired: the alert resolved" in response.json()["error"]["message"]
    assert decode_replicas(quiet_deployment) == 1


def test_advice_no_evaluation_confirmed_lately_is_a_409(operator_api, advised, quiet_deployment):
    rule, advice = advised
    ActionAdvice.objects.filter(pk=advice.pk).update(evaluated_at=timezone.now() - timedelta(hours=1))
    response = operator_api.post(apply_url(rule, advice), {}, format="json")
    assert response.status_code == 409 and "no evaluation confirmed it since" in response.json()["error"]["message"]


def test_superseded_advice_is_a_409_and_advice_of_another_rule_a_404(operator_api, advised, admin_api):
    rule, advice = advised
    assert admin_api.patch(f"/api/v1/alert-rules/{rule.pk}/", {"advisory": False}, format="json").status_code == 200
    response = operator_api.post(apply_url(rule, advice), {}, format="json")
    assert response.status_code == 409
    assert "is stale: superseded: the rule's advisory mode was turned off" in response.json()["error"]["message"]
    assert operator_api.post(f"/api/v1/alert-rules/{rule.pk + 1000}/advice/{advice.pk}/apply", {},
                             format="json").status_code == 404


def test_the_rules_advisory_switch_is_validated_and_shown(admin_api, advised):
    rule, _ = advised
    response = admin_api.patch(f"/api/v1/alert-rules/{rule.pk}/", {"advisory": "maybe"}, format="json")
    assert response.status_code == 400 and "advisory" in response.content.decode()
    assert admin_api.get(f"/api/v1/alert-rules/{rule.pk}/").json()["advisory"] is True


def test_advice_of_a_rule_switched_off_in_django_admin_is_a_409(operator_api, advised, quiet_deployment):
    from controlplane.alerting.models import AlertRule

    rule, advice = advised
    AlertRule.objects.filter(pk=rule.pk).update(advisory=False)  # as the admin's form saves it: no withdrawal
    response = operator_api.post(apply_url(rule, advice), {}, format="json")
    assert response.status_code == 409 and "no longer advises" in response.json()["error"]["message"]
    assert decode_replicas(quiet_deployment) == 1
