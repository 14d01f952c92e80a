"""The autoscaler's advice on the deployment page: the mode, each pool's open advice with an Apply button for
operators (a CSRF-checked POST through advice_apply, as the API's apply) that scales the pool, after which reconcile
starts the worker; stale advice becomes a message."""
from __future__ import annotations

import re
import time

import pytest

from controlplane.autoscaling.autoscaler import autoscale_pool
from controlplane.autoscaling.models import ScaleAdvice
from controlplane.autoscaling.selectors import autoscaling_settings
from controlplane.autoscaling.services import autoscaling_update
from controlplane.models import Action, Worker
from controlplane.services import pool_scale
from controlplane.supervision.reconcile import reconcile_deployment
from tests.controlplane.autoscaling.support import observe, pool_of
from tests.controlplane.conftest import online_node, sent  # noqa: F401  (shared fixtures)

pytestmark = pytest.mark.django_db


def advise(deployment, operator) -> ScaleAdvice:
    autoscaling_update(deployment=deployment, actor=operator, enabled=True, mode="advisory")
    observe(deployment, "itl_p99_seconds", 0.3)  # three times the default decode target
    autoscale_pool(pool_of(deployment), now=time.time())
    return ScaleAdvice.objects.get(status="open")


def test_the_page_shows_the_mode_and_the_advice_with_apply_for_operators_only(client_for, operator, viewer,
                                                                             deployment, make_worker):
    make_worker(deployment, "decode")
    advice = advise(deployment, operator)
    page = client_for(operator).get("/deployments/demo/").content.decode()
    assert re.search(r'data-testid="autoscaler-mode"[^>]*>advisory<', page)
    assert f"advice #{advice.pk}: <strong>1 → 3</strong>" in page
    assert 'data-testid="advice-apply-decode"' in page
    page = client_for(viewer).get("/deployments/demo/live").content.decode()
    assert f"advice #{advice.pk}:" in page and "advice-apply-decode" not in page


def test_apply_scales_the_pool_and_reconcile_starts_the_worker(client_for, operator, deployment, make_worker,
                                                               online_node, sent,  # noqa: F811
                                                               django_capture_on_commit_callbacks):
    make_worker(deployment, "prefill")
    make_worker(deployment, "decode")
    advice = advise(deployment, operator)
    client = client_for(operator, enforce_csrf=True)
    url = f"/deployments/demo/autoscaling/advice/{advice.pk}/apply"
    assert client.post(url, {}).status_code == 403  # no CSRF token
    page = client.get("/deployments/demo/").content.decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    response = client.post(url, {"csrfmiddlewaretoken": token, "idempotency_key": "dash-1"})
    action = Action.objects.get(kind="scale")
    assert response.status_code == 302 and response["Location"] == f"/deployments/demo/?action={action.pk}"
    assert (action.actor, action.params) == ("otto-operator", {"role": "decode", "from": 1, "to": 3})
    assert action.reason.startswith(f"applied autoscaler advice #{advice.pk}; dashboard: Apply button: ")
    assert pool_of(deployment).desired_replicas == 3
    with django_capture_on_commit_callbacks(execute=True):
        reconcile_deployment(deployment.pk)
    started = Worker.objects.filter(deployment=deployment, role="decode", status="pending")
    assert started.count() == 2
    assert all(("agent_start_worker", (worker.pk,), "node.local") in sent for worker in started)


def test_stale_advice_is_a_message_and_scales_nothing(client_for, operator, deployment, make_worker):
    make_worker(deployment, "decode")
    advice = advise(deployment, operator)
    pool_scale(deployment=deployment, role="decode", replicas=2, actor=operator, reason="by hand")
    response = client_for(operator).post(f"/deployments/demo/autoscaling/advice/{advice.pk}/apply", {},
                                         follow=True)
    assert "is stale: it scales decode from 1, and the pool has 2 desired replicas now" in \
        response.content.decode()
    assert pool_of(deployment).desired_replicas == 2


def test_an_operator_switches_the_mode_from_the_page_and_a_bad_one_is_a_message(client_for, operator, deployment):
    client = client_for(operator)
    response = client.post("/deployments/demo/autoscaling", {"mode": "advisory"}, follow=True)
    assert "Autoscaler of demo in advisory mode." in response.content.decode()
    assert "Let it scale (active)" in response.content.decode()
    response = client.post("/deployments/demo/autoscaling", {"mode": "chaotic"}, follow=True)
    assert "mode must be one of active, advisory, not &#x27;chaotic&#x27;" in response.content.decode()
    assert autoscaling_settings(deployment).mode == "advisory"
