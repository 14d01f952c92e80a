"""Advisory rules' advice on the alerts page: each open advice with its inputs, and an Apply button for operators (a
CSRF-checked POST through advice_apply, as the API's apply) that carries the action out; stale advice becomes a
message."""
from __future__ import annotations

import re

import pytest
from django.utils import timezone

from controlplane.alerting.models import ActionAdvice, AlertRule
from controlplane.alerting.services.evaluation import evaluate_rules
from controlplane.alerting.services.rules import rule_create
from controlplane.models import Action, Pool
from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Sample
from controlplane.services import pool_scale

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _raw_samples(settings):
    settings.TANDEM_METRICS_RAW_RETENTION_S = 10 * 365 * 86400


def advise(deployment) -> ActionAdvice:
    AlertRule.objects.filter(deployment=deployment).delete()
    rule_create(name="kv-advised", deployment=deployment, role="decode", metric="kv_cache_usage_ratio",
                aggregation="last", comparison=">", threshold=0.9, cooldown_s=0, advisory=True,
                actions=[{"type": "scale", "direction": "up", "step": 1}])
    now = timezone.now()
    Sample.objects.create(ts=now.timestamp(), deployment_id=deployment.pk, role="decode", worker_id=None,
                          metric=METRIC_IDS["kv_cache_usage_ratio"], value=0.95)
    evaluate_rules(now=now)
    return ActionAdvice.objects.get(status="open")


def decode_replicas(deployment) -> int:
    return Pool.objects.get(deployment=deployment, role="decode").desired_replicas


def test_the_page_shows_open_advice_with_apply_for_operators_only(client_for, operator, viewer, deployment):
    advice = advise(deployment)
    page = client_for(operator).get("/alerts/").content.decode()
    section = page.split('id="advice"')[1].split('id="pending"')[0]
    assert f'data-advice="{advice.pk}"' in section and "kv-advised" in section
    assert "<strong>scale</strong> up 1" in section and "0.9500" in section
    assert f'data-testid="advice-apply-{advice.pk}"' in section
    assert 'pill warn" title="records scale, restart and rollback as advice' in page  # the rule is marked advisory
    section = client_for(viewer).get("/alerts/").content.decode().split('id="advice"')[1].split('id="pending"')[0]
    assert f'data-advice="{advice.pk}"' in section and "advice-apply-" not in section


def test_apply_needs_csrf_and_carries_the_action_out_as_the_operators(client_for, operator, deployment):
    advice = advise(deployment)
    client = client_for(operator, enforce_csrf=True)
    url = f"/alerts/rules/{advice.rule_id}/advice/{advice.pk}/apply"
    assert client.post(url, {}).status_code == 403  # no CSRF token
    page = client.get("/alerts/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = client.post(url, {"csrfmiddlewaretoken": token, "idempotency_key": "dash-1"})
    assert response.status_code == 302 and response["Location"] == "/alerts/#advice"
    action = Action.objects.get(kind="scale")
    assert (action.actor, action.params) == ("otto-operator", {"role": "decode", "from": 1, "to": 2})
    assert action.reason.startswith(f"applied alert advice #{advice.pk}; dashboard: Apply button: alert rule")
    assert decode_replicas(deployment) == 2


def test_a_viewer_may_not_apply(client_for, viewer, deployment):
    advice = advise(deployment)
    response = client_for(viewer).post(f"/alerts/rules/{advice.rule_id}/advice/{advice.pk}/apply", {})
    assert response.status_code == 403 and decode_replicas(deployment) == 1


def test_stale_advice_is_a_message_and_changes_nothing(client_for, operator, deployment):
    advice = advise(deployment)
    pool_scale(deployment=deployment, role="decode", replicas=3, actor=operator, reason="by hand")
    response = client_for(operator).post(f"/alerts/rules/{advice.rule_id}/advice/{advice.pk}/apply", {},
                                         follow=True)
    assert "is stale: its target changed since it was advised (replicas 1; now: replicas 3)" in \
        response.content.decode()
    assert decode_replicas(deployment) == 3


def test_the_rule_form_sets_the_advisory_switch(client_for, admin, deployment):
    advice = advise(deployment)
    page = client_for(admin).get(f"/alerts/rules/{advice.rule_id}/").content.decode()
    assert re.search(r'name="advisory"[^>]*checked', page)
