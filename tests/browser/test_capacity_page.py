"""The capacity page in Chromium: profile plots drawn, the plan computed on load, what-if sliders recompute it
(traffic × 4 asks for more replicas, a tighter ITL objective too), and Apply after a confirmation makes one scale
action per pool. A viewer sees the plan but no Apply button. No script error, no CSP violation."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser

WAIT_MS = 90_000  # a plan is a few dozen simulations; a loaded 2-core machine takes seconds


@pytest.fixture
def profiled(transactional_db, deployment):
    from controlplane.capacity.models import Profile

    revision = deployment.current_revision
    common = {"max_num_seqs": 32, "max_batch_tokens": 2048, "kv_capacity_tokens": 60_000, "kv_bytes_per_token": 4096}
    prefill_points = [{"prompt_tokens": n, "batch": b, "batch_tokens": n * b, "latency_s": 0.01 + 2e-4 * n * b,
                       "source": "synthetic"} for n in (16, 64, 256) for b in (1, 4)]
    decode_points = [{"batch": b, "context": c, "step_s": 0.01 + 5e-4 * b + 1e-7 * b * c, "source": "synthetic"}
                     for b in (1, 4, 8) for c in (32, 256)]
    decode_points.append({"batch": 3, "context": 180, "step_s": 0.0125, "source": "live"})
    Profile.objects.create(revision=revision, role="prefill", fits={"prefill": {"a": 0.01, "b": 2e-4, "c": 0.0}},
                           points={"prefill": prefill_points}, **common)
    Profile.objects.create(revision=revision, role="decode", fits={"decode": {"a": 0.01, "b": 5e-4, "c": 1e-7}},
                           points={"decode": decode_points}, **common)
    return deployment


def set_slider(page, selector: str, value) -> None:
    page.eval_on_selector(selector, "(el, v) => { el.value = v; el.dispatchEvent(new Event('input', "
                                    "{bubbles: true})); }", str(value))


def wait_plan(page) -> dict:
    page.wait_for_function("() => document.getElementById('capacity').dataset.planState === 'ready'",
                           timeout=WAIT_MS)
    cells = page.eval_on_selector_all("#plan-table tbody tr", "rows => rows.map(r => [r.dataset.layout, "
                                      "r.children[1].dataset.replicas])")
    import json

    return {layout: json.loads(replicas) if replicas else None for layout, replicas in cells}


def total(replicas: dict) -> int:
    return sum(replicas.values())


def test_sliders_recompute_and_apply_scales_each_pool(page, live_server, login, operator, profiled, screenshot):
    from controlplane.models import Action, Pool

    login(page, operator)
    page.goto(f"{live_server.url}/deployments/demo/capacity/", timeout=WAIT_MS)
    wait_plan(page)
    page.evaluate("() => { document.getElementById('capacity').dataset.planState = 'stale'; }")
    page.fill("input[name=requests_per_s]", "5")
    page.fill("input[name=prompt_tokens_mean]", "200")
    page.fill("input[name=output_tokens_mean]", "50")
    base = wait_plan(page)
    assert set(base) == {"disaggregated", "colocated"}
    assert int(page.get_attribute("#chart-prefill", "data-points")) == 6
    assert int(page.get_attribute("#chart-decode", "data-points")) == 7  # 6 synthetic + 1 live

    page.evaluate("() => { document.getElementById('capacity').dataset.planState = 'stale'; }")
    set_slider(page, "#what-traffic", 4)
    more = wait_plan(page)
    assert page.inner_text("#traffic-out") == "4"
    assert total(more["colocated"]) > total(base["colocated"])
    assert total(more["disaggregated"]) >= total(base["disaggregated"])

    page.evaluate("() => { document.getElementById('capacity').dataset.planState = 'stale'; }")
    set_slider(page, "#what-itl", 20)
    tight = wait_plan(page)
    assert page.inner_text("#itl-out") == "20"
    assert total(tight["colocated"]) > total(more["colocated"])  # prefill stalls now cost ITL objectives
    screenshot(page, "capacity-plan")

    planned = tight["disaggregated"]
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.accept()))
    page.click("#plan-apply")
    page.wait_for_function("() => document.getElementById('apply-result').textContent.startsWith('applied')",
                           timeout=WAIT_MS)
    assert dialogs and "audited scale action" in dialogs[0]
    assert dict(Pool.objects.filter(deployment=profiled).values_list("role", "desired_replicas")) == planned
    actions = Action.objects.filter(deployment=profiled, kind="scale")
    assert actions.count() == 2 and set(actions.values_list("actor", flat=True)) == {operator.username}
    assert page.js_errors == [] and page.csp_violations == []


def test_dismissing_the_confirmation_applies_nothing(page, live_server, login, operator, profiled):
    from controlplane.models import Action

    login(page, operator)
    page.goto(f"{live_server.url}/deployments/demo/capacity/", timeout=WAIT_MS)
    wait_plan(page)
    page.on("dialog", lambda dialog: dialog.dismiss())
    page.click("#plan-apply")
    page.wait_for_timeout(500)  # nothing to wait for: a dismissed dialog sends no request
    assert not Action.objects.filter(kind="scale").exists()


def test_a_viewer_sees_the_plan_but_no_apply_button(page, live_server, login, viewer, profiled):
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/capacity/", timeout=WAIT_MS)
    assert set(wait_plan(page)) == {"disaggregated", "colocated"}
    assert page.locator("#plan-apply").count() == 0 and page.locator("#profile-start").count() == 0
