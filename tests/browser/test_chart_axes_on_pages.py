"""Axes as plotly draws them in Chromium: request rates below 1 read 0.5, not "500m"; the rollout page's error ratio
of zero sits on an axis from 0 (not −1..1) and its charts are drawn in the deployment page's style."""
from __future__ import annotations

import time

import pytest

from tests.browser.charts import drawn_chart

pytestmark = pytest.mark.browser

Y_TICKS = "div => Array.from(div.querySelectorAll('.ytick text')).map(t => t.textContent)"


def test_the_deployment_pages_request_rate_ticks_are_plain_numbers(page, live_server, login, viewer, fleet):
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/")
    drawn_chart(page, "qps")  # 1.0 to 1.8 req/s: ticks at 0, 0.5, 1, 1.5
    ticks = page.eval_on_selector("#chart-qps", Y_TICKS)
    assert "0.5" in ticks and not any(tick.endswith("m") for tick in ticks), ticks
    assert page.js_errors == []


def test_the_rollout_pages_charts_have_the_deployment_pages_style_and_no_negative_ratio(page, live_server, login,
                                                                                        viewer, fleet, operator):
    from controlplane.observability.catalog import METRIC_IDS
    from controlplane.observability.models import RevisionSample
    from controlplane.rollouts.services import rollout_start
    from controlplane.services.revisions import revision_add

    deployment = fleet["deployment"]
    revision_add(deployment=deployment, actor=operator, model_path=None, dtype=None, engine_settings=None)
    rollout = rollout_start(deployment=deployment, actor=operator, revision=3,
                            steps=[{"weight": 20, "duration_s": 600}])
    now = time.time()
    RevisionSample.objects.bulk_create([
        RevisionSample(ts=now + 5 * i, deployment_id=deployment.pk, revision=revision, metric=METRIC_IDS[metric],
                       value=value)
        for i in range(6) for revision in (2, 3) for metric, value in (("error_ratio", 0.0), ("qps", 0.3))])
    login(page, viewer)
    page.goto(f"{live_server.url}/deployments/demo/rollouts/{rollout.pk}/")
    errors = ".chart[data-chart='error_ratio']"
    page.wait_for_selector(f"{errors} .main-svg")
    low, high = page.eval_on_selector(errors, "div => div._fullLayout.yaxis.range")
    assert low == 0 and high > 0
    assert all(tick.endswith("%") for tick in page.eval_on_selector(errors, Y_TICKS))
    rates = page.eval_on_selector(".chart[data-chart='qps']", Y_TICKS)
    assert not any(tick.endswith("m") for tick in rates), rates
    # The deployment page's chart style: its height, font and legend below the plot.
    style = page.eval_on_selector(errors, "div => [div._fullLayout.height, div._fullLayout.font.family, "
                                          "div._fullLayout.legend.orientation]")
    assert style == [230, "system-ui, sans-serif", "h"]
    assert page.js_errors == []
