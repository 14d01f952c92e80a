"""A viewer sees every page and no button; screenshots of the alerts and actions pages."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def test_a_viewer_sees_no_buttons(page, live_server, login, viewer, fleet, screenshot):
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.alerting.models import Alert, AlertRule
    from controlplane.services import pool_scale

    pool_scale(deployment=fleet["deployment"], role="decode", replicas=2, actor=viewer, reason="seeded history")
    rule = AlertRule.objects.create(name="e2e-p99-high", deployment=fleet["deployment"], metric="e2e_p99_seconds",
                                    comparison=">", threshold=0.5, severity="critical")
    now = timezone.now()
    Alert.objects.create(rule=rule, fingerprint="f", labels={"alertname": rule.name, "deployment": "demo"},
                         deployment=fleet["deployment"], state="firing", value=0.61,
                         active_at=now - timedelta(minutes=4), fired_at=now - timedelta(minutes=3),
                         last_true_at=now, last_evaluated_at=now)
    login(page, viewer)
    for path, name in (("/deployments/demo/", "deployment-viewer"), ("/alerts/", "alerts"),
                       ("/actions/", "actions"), ("/deployments/demo/revisions/", "revisions-viewer")):
        page.goto(f"{live_server.url}{path}")
        if path == "/deployments/demo/":
            page.wait_for_function(
                "() => Number((document.getElementById('chart-ttft') || {dataset: {}}).dataset.points) > 0")
        assert page.locator("main form[method=post]").count() == 0, path
        assert page.locator("[data-testid^='scale-'], [data-testid^='rollback-'], [data-testid^='silence-']"
                            ).count() == 0, path
        screenshot(page, name)


def test_a_viewer_sees_a_tenants_charts_drawn(page, live_server, login, viewer, fleet, screenshot):
    import time

    from controlplane.observability.catalog import METRIC_IDS
    from controlplane.observability.models import TenantSample
    from controlplane.tenants.models import Tenant

    Tenant.objects.create(name="acme", tokens_per_minute=6000).deployments.add(fleet["deployment"])
    now = time.time()
    TenantSample.objects.bulk_create([
        TenantSample(ts=now - 600 + i * 5, deployment_id=fleet["deployment"].pk, tenant="acme",
                     metric=METRIC_IDS[metric], value=value * (1 + (i % 12) / 12))
        for i in range(120) for metric, value in (("qps", 1.5), ("ttft_p99_seconds", 0.2),
                                                  ("tokens_per_minute_quota_ratio", 0.6))])
    login(page, viewer)
    page.goto(f"{live_server.url}/tenants/")
    page.click("a[href='/tenants/acme/']")
    page.wait_for_function("() => Number((document.getElementById('chart-qps') || {dataset: {}}).dataset.draws) > 0")
    assert int(page.locator("#chart-qps").get_attribute("data-points")) > 0
    assert page.locator("main form[method=post]").count() == 0
    screenshot(page, "tenant-viewer")
