"""Clicking decode +1 changes the desired replicas, writes an action row and a new worker appears."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def test_decode_plus_one_scales_the_pool_and_a_new_worker_appears(page, live_server, login, operator, fleet,
                                                                  eager_reconcile, screenshot):
    from controlplane.models import Action, Pool, Worker

    login(page, operator)
    page.goto(f"{live_server.url}/deployments/demo/")
    assert page.locator("#workers tr[data-role='decode']").count() == 1
    page.click("[data-testid='scale-up-decode']")
    page.wait_for_selector(".msg.success")
    assert page.inner_text("[data-testid='desired-decode']") == "2"
    assert Pool.objects.get(deployment=fleet["deployment"], role="decode").desired_replicas == 2
    action = Action.objects.get(kind="scale")
    assert (action.actor, action.params["from"], action.params["to"]) == ("otto-operator", 1, 2)
    # The action's progress row and the new (pending) decode worker that reconcile created for it.
    assert page.is_visible(f"[data-testid='action-status-{action.pk}']")
    page.wait_for_function("() => document.querySelectorAll(\"#workers tr[data-role='decode']\").length === 2")
    new = Worker.objects.filter(deployment=fleet["deployment"], role="decode").order_by("-id").first()
    assert new.pk != fleet["workers"][1].pk and ("agent_start_worker", (new.pk,)) in eager_reconcile
    assert page.is_visible(f"#workers tr[data-worker='{new.pk}']")
    screenshot(page, "deployment-after-scale")


def test_a_scale_beyond_max_shows_the_message(page, live_server, login, operator, fleet):
    login(page, operator)
    page.goto(f"{live_server.url}/deployments/demo/")
    page.fill("input[aria-label='replicas for prefill']", "50")
    page.click("[data-testid='scale-set-prefill']")
    page.wait_for_selector(".msg.error")
    assert "must be between 1 and 8" in page.inner_text(".msg.error")
