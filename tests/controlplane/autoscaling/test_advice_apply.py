"""Applying the autoscaler's advice (POST .../autoscaling/advice/{id}/apply): it scales through pool_scale as the
operator's audited action naming the advice, counts as the autoscaler's own scale afterwards, and refuses stale
advice with a 409 that says why."""
import time
from datetime import timedelta

from controlplane.autoscaling.autoscaler import autoscale_pool
from controlplane.autoscaling.models import ScaleAdvice
from controlplane.models import Action, ActorType
from controlplane.services import pool_scale
from tests.controlplane.autoscaling.support import advisory, observe, pool_of

URL = "/api/v1/deployments/demo/autoscaling/advice"


def advise(deployment, operator, *, itl=0.3, now=None) -> ScaleAdvice:
    advisory(deployment, operator)
    observe(deployment, "itl_p99_seconds", itl, at=(now or time.time()) - 1)
    autoscale_pool(pool_of(deployment), now=now or time.time())
    return ScaleAdvice.objects.filter(status="open").get()


def test_an_operator_applies_advice_and_the_pool_scales_as_an_audited_action(scaled, operator, operator_api):
    advice = advise(scaled, operator)
    response = operator_api.post(f"{URL}/{advice.pk}/apply", {"reason": "looks right"}, format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["advice"]["status"] == "applied" and body["advice"]["applied_by"] == "otto-operator"
    assert pool_of(scaled).desired_replicas == 3
    action = Action.objects.get(pk=body["action"]["id"])
    assert (action.kind, action.actor_type, action.actor) == ("scale", ActorType.USER, "otto-operator")
    assert action.params == {"role": "decode", "from": 1, "to": 3}
    assert action.reason.startswith(f"applied autoscaler advice #{advice.pk}; looks right: itl_p99_seconds 0.3")
    advice.refresh_from_db()
    assert advice.action_id == action.pk and advice.settled_at is not None


def test_the_applied_scale_is_the_autoscalers_own_neither_a_pause_nor_a_new_step(scaled, operator, operator_api,
                                                                                  make_worker):
    now = time.time()
    advice = advise(scaled, operator, now=now)
    assert operator_api.post(f"{URL}/{advice.pk}/apply", {}, format="json").status_code == 202
    make_worker(scaled, "decode")
    make_worker(scaled, "decode")  # the three workers are ready
    observe(scaled, "itl_p99_seconds", 0.5, at=now + 4)
    decision = autoscale_pool(pool_of(scaled), now=now + 5)
    # Not "paused until ...": a manual scale would pause it. The step of ±2 counts from 1, where the applied
    # scale began, as it would from the active autoscaler's own scale: 3 stays the most for this step period.
    assert decision is not None and decision.desired == 3 and "step ±2 from 1" in decision.reason


def test_stale_advice_is_a_409_saying_why(scaled, operator, operator_api, settings):
    settings.TANDEM_AUTOSCALE_MAX_STEP = 10
    now = time.time()
    first = advise(scaled, operator, now=now)
    observe(scaled, "itl_p99_seconds", 0.5, at=now + 4)
    autoscale_pool(pool_of(scaled), now=now + 5)
    second = ScaleAdvice.objects.get(status="open")
    response = operator_api.post(f"{URL}/{first.pk}/apply", {}, format="json")
    assert response.status_code == 409
    assert f"advice #{first.pk} is stale: superseded by advice #{second.pk} (1 → 5)" in \
        response.json()["error"]["message"]

    pool_scale(deployment=scaled, role="decode", replicas=2, actor=operator, reason="by hand")
    response = operator_api.post(f"{URL}/{second.pk}/apply", {}, format="json")
    assert response.status_code == 409
    assert "scales decode from 1, and the pool has 2 desired replicas now" in response.json()["error"]["message"]
    assert pool_of(scaled).desired_replicas == 2
    assert ScaleAdvice.objects.get(pk=second.pk).status == "open"  # a refused apply claims nothing


def test_advice_no_evaluation_confirmed_lately_is_stale(scaled, operator, operator_api):
    advice = advise(scaled, operator)
    ScaleAdvice.objects.filter(pk=advice.pk).update(evaluated_at=advice.evaluated_at - timedelta(hours=1))
    response = operator_api.post(f"{URL}/{advice.pk}/apply", {}, format="json")
    assert response.status_code == 409 and "no evaluation confirmed it since" in response.json()["error"]["message"]
    assert pool_of(scaled).desired_replicas == 1


def test_applied_advice_is_not_applied_twice_but_a_repeated_key_answers_the_same(scaled, operator, operator_api):
    advice = advise(scaled, operator)
    first = operator_api.post(f"{URL}/{advice.pk}/apply", {"idempotency_key": "k1"}, format="json")
    again = operator_api.post(f"{URL}/{advice.pk}/apply", {"idempotency_key": "k1"}, format="json")
    assert (first.status_code, again.status_code) == (202, 202)
    assert first.json()["action"]["id"] == again.json()["action"]["id"]
    other = operator_api.post(f"{URL}/{advice.pk}/apply", {"idempotency_key": "k2"}, format="json")
    assert other.status_code == 409 and "already applied by otto-operator" in other.json()["error"]["message"]
    assert Action.objects.filter(kind="scale").count() == 1


def test_viewers_cannot_apply_and_another_deployments_advice_is_404(scaled, operator, viewer_api, operator_api,
                                                                    make_deployment):
    advice = advise(scaled, operator)
    make_deployment("other")
    assert viewer_api.post(f"{URL}/{advice.pk}/apply", {}, format="json").status_code == 403
    assert operator_api.post(f"/api/v1/deployments/other/autoscaling/advice/{advice.pk}/apply", {},
                             format="json").status_code == 404
    assert operator_api.post(f"{URL}/99999999999999999999/apply", {}, format="json").status_code == 404
    assert pool_of(scaled).desired_replicas == 1
