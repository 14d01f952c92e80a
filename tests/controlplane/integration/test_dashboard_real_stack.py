"""The whole loop with nothing stubbed: a real control-plane stack (web, Celery control worker with beat, node
agent: tests/controlplane/integration/live.py), a tiny-model deployment, real scraping. In Chromium: the charts
fill with scraped points, and clicking decode +1 starts a real decode worker that becomes ready in the table
without a page reload."""
from __future__ import annotations

import pytest

from tests.browser_support import chromium, page, screenshot  # noqa: F401  (Chromium through Playwright)
from tests.controlplane.integration.conftest import DEPLOYMENT, completion, wait_steady  # noqa: F401
from tests.controlplane.integration.live import manage

pytestmark = [pytest.mark.browser, pytest.mark.integration]

PASSWORD = "real-stack-password"


def _operator(live) -> str:
    manage(live.env, "tandem_token", "it-operator", "--role", "operator")
    manage(live.env, "shell", "-c", (
        "from django.contrib.auth import get_user_model as m; u = m().objects.get(username='it-operator'); "
        f"u.set_password({PASSWORD!r}); u.save()"))
    return "it-operator"


def _ready_decode_rows(page) -> int:
    return page.locator("#workers tr[data-role='decode'] .pill.ok").count()


def test_a_real_scale_up_from_the_page_starts_a_ready_decode_worker(page, live, deployment, screenshot):
    wait_steady(live)
    for prompt in ("Hello", "The fleet", "Tandem"):
        assert completion(deployment, prompt).status_code == 200
    username = _operator(live)
    page.goto(f"{live.web_url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{live.web_url}/")
    page.goto(f"{live.web_url}/deployments/{DEPLOYMENT}/?range=15m")
    # Scraped every few seconds; the page redraws every 5 s, so the points arrive without a reload.
    page.wait_for_function(
        "() => Number((document.getElementById('chart-qps') || {dataset: {}}).dataset.points) > 0", timeout=90_000)
    assert _ready_decode_rows(page) == 1

    page.click("[data-testid='scale-up-decode']")
    page.wait_for_selector(".msg.success")
    page.evaluate("() => { window.__not_reloaded = true; }")
    page.wait_for_function(
        "() => document.querySelectorAll(\"#workers tr[data-role='decode'] .pill.ok\").length === 2",
        timeout=150_000)
    assert page.evaluate("() => window.__not_reloaded") is True
    screenshot(page, "real-stack-deployment")
    actions = live.actions(DEPLOYMENT, kind="scale")
    assert actions[0]["actor"] == username and actions[0]["params"]["to"] == 2

    page.click("[data-testid='scale-down-decode']")  # leave the deployment as the integration tests expect it
    page.wait_for_selector(".msg.success")
    wait_steady(live, decode=1)
