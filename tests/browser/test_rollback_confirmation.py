"""Rollback asks for confirmation, saying which workers of which pools will be replaced."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def test_rollback_asks_for_confirmation_then_rolls_back(page, live_server, login, operator, fleet,
                                                        eager_reconcile, screenshot):
    from controlplane.models import Action

    login(page, operator)
    page.goto(f"{live_server.url}/deployments/demo/revisions/")
    screenshot(page, "revisions")
    page.click("[data-testid='rollback-1']")
    page.wait_for_url(f"{live_server.url}/deployments/demo/rollback/1/")
    replaced = page.inner_text("#replaced")
    prefill, decode = fleet["workers"][0], fleet["workers"][1]
    assert f"#{prefill.pk} ready · rev #2" in replaced and f"#{decode.pk} ready · rev #2" in replaced
    assert "common.threads" in page.inner_text("#confirm")  # the diff names the part (per-role settings)
    assert not Action.objects.filter(kind="rollback").exists()  # nothing happened yet
    screenshot(page, "rollback-confirm")

    page.fill("input[name=reason]", "p99 regression after revision 2")
    page.click("[data-testid='confirm-rollback']")
    page.wait_for_url(f"{live_server.url}/deployments/demo/?action=*")
    action = Action.objects.get(kind="rollback")
    assert action.reason == "dashboard: p99 regression after revision 2"
    assert "Rollout in progress" in page.inner_text("#live")
    fleet["deployment"].refresh_from_db()
    assert fleet["deployment"].current_revision.number == 1
