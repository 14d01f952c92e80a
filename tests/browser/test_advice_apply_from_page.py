"""In advisory mode the autoscaler's advice shows on the deployment page; clicking Apply scales the pool as the
operator's action naming the advice, and reconcile starts the new workers."""
from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.browser


def test_apply_on_the_page_scales_decode_and_its_new_workers_start(page, live_server, login, operator, fleet,
                                                                   eager_reconcile, screenshot):
    from controlplane.autoscaling.autoscaler import autoscale_pool
    from controlplane.autoscaling.models import ScaleAdvice
    from controlplane.autoscaling.services import autoscaling_update
    from controlplane.models import Action, Worker
    from tests.controlplane.autoscaling.support import observe, pool_of

    deployment = fleet["deployment"]
    autoscaling_update(deployment=deployment, actor=operator, enabled=True, mode="advisory")
    observe(deployment, "itl_p99_seconds", 0.3)  # three times the default decode target
    autoscale_pool(pool_of(deployment), now=time.time())
    advice = ScaleAdvice.objects.get(status="open")
    assert Worker.objects.filter(deployment=deployment, role="decode").count() == 1  # advice starts nothing

    login(page, operator)
    page.goto(f"{live_server.url}/deployments/demo/")
    assert "1 → 3" in page.inner_text("[data-testid='advice-decode']")
    page.click("[data-testid='advice-apply-decode']")
    page.wait_for_selector(".msg.success")
    assert page.inner_text("[data-testid='desired-decode']") == "3"
    action = Action.objects.get(kind="scale")
    assert action.actor == "otto-operator" and f"advice #{advice.pk}" in action.reason
    page.wait_for_function("() => document.querySelectorAll(\"#workers tr[data-role='decode']\").length === 3")
    new = Worker.objects.filter(deployment=deployment, role="decode").exclude(pk=fleet["workers"][1].pk)
    assert new.count() == 2 and all(("agent_start_worker", (w.pk,)) in eager_reconcile for w in new)
    screenshot(page, "deployment-after-advice-apply")
