"""The capacity page in Chromium before any profile exists: no plan is requested (the API could only answer 400),
the page says what to do instead; when a profile run finishes, its plots, fits and the plan appear in place,
without a reload."""
from __future__ import annotations

import pytest

from tests.browser.test_capacity_page import WAIT_MS, wait_plan

pytestmark = pytest.mark.browser


def _profiles(revision) -> None:
    from controlplane.capacity.models import Profile

    common = {"max_num_seqs": 32, "max_batch_tokens": 2048, "kv_capacity_tokens": 60_000, "kv_bytes_per_token": 4096}
    Profile.objects.create(revision=revision, role="prefill", fits={"prefill": {"a": 0.01, "b": 2e-4, "c": 0.0}},
                           points={"prefill": [{"prompt_tokens": n, "batch": 1, "batch_tokens": n,
                                                "latency_s": 0.01 + 2e-4 * n, "source": "synthetic"}
                                               for n in (16, 64, 256)]}, **common)
    Profile.objects.create(revision=revision, role="decode", fits={"decode": {"a": 0.01, "b": 5e-4, "c": 0.0}},
                           points={"decode": [{"batch": b, "context": 64, "step_s": 0.01 + 5e-4 * b,
                                               "source": "synthetic"} for b in (1, 4, 8)]}, **common)


def test_no_plan_is_requested_until_a_profile_run_finishes_and_then_it_shows_in_place(
        page, live_server, login, admin, transactional_db, deployment):
    from controlplane.capacity.models import ProfileJob

    job = ProfileJob.objects.create(deployment=deployment, revision=deployment.current_revision, status="running",
                                    progress=0.4, step="decode at batch 4")
    plans, console_errors = [], []
    page.on("request", lambda request: plans.append(request.method) if "/capacity/plan" in request.url else None)
    page.on("console", lambda message: console_errors.append(message.text) if message.type == "error" else None)
    login(page, admin)
    page.goto(f"{live_server.url}/deployments/demo/capacity/")
    page.wait_for_function("() => document.getElementById('capacity').dataset.planState === 'no-profile'")
    assert "needs a profile" in page.inner_text("#plan-state")
    assert page.is_visible("#no-profile")
    page.wait_for_function("() => document.getElementById('profile-status').textContent.includes('running')")
    page.evaluate("() => { window.__not_reloaded = true; }")
    page.fill("input[name=requests_per_s]", "3")  # an input without a profile asks for no plan either
    page.wait_for_timeout(600)
    assert plans == [] and console_errors == []

    _profiles(deployment.current_revision)
    ProfileJob.objects.filter(pk=job.pk).update(status="succeeded", progress=1.0, step="done")
    page.wait_for_function("() => document.getElementById('profile-status').textContent.includes('updated')",
                           timeout=WAIT_MS)
    assert page.evaluate("() => window.__not_reloaded") is True
    assert "reload" not in page.inner_text("#profile-status")
    assert page.locator("#no-profile").count() == 0
    assert "one prompt of n tokens ≈ 10 ms + 200 µs/token·n" in page.inner_text("#profile-table")
    page.wait_for_selector("#chart-prefill .main-svg")
    assert int(page.get_attribute("#chart-decode", "data-points")) == 3
    assert set(wait_plan(page)) == {"disaggregated", "colocated"}
    assert plans and console_errors == [] and page.js_errors == []
