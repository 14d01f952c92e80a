"""A tenant's series read the same in both metrics backends: the embedded store's TenantSample rows, and a real
Prometheus' `tandem_tenant:` recording-rule series (seeded as TSDB blocks, as test_range_reads seeds the pool
series). In each, the rule for the tenant near its quota fires and the rule for the other tenant does not, and the
tenant page's range read draws the same points."""
from __future__ import annotations

import math
import subprocess
import time
from datetime import datetime, timezone

import pytest

from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.recording_rules import TENANT_PREFIX
from tests.controlplane.observability.seeded_prometheus import PROMETHEUS, PROMTOOL, Prometheus

pytestmark = pytest.mark.integration

METRIC = "tokens_per_minute_quota_ratio"
LEVELS = {"acme": 0.95, "beta": 0.4}  # share of its tokens_per_minute used


def rows(t0: float) -> list[tuple[float, str, float]]:
    """(ts, tenant, value): five minutes of 5 s samples ending just before t0."""
    return [(t0 - 300 + k * 5 + 1.3, tenant, level) for tenant, level in LEVELS.items() for k in range(60)]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip("prometheus/promtool not installed (Debian package `prometheus`)")
    directory = tmp_path_factory.mktemp("tenant-prometheus")
    t0 = float(math.floor(time.time()))
    name = TENANT_PREFIX + METRIC
    lines = [f'{name}{{deployment="demo",tenant="{tenant}"}} {value!r} {ts:.3f}' for ts, tenant, value in rows(t0)]
    (directory / "seeded.om").write_text(f"# TYPE {name} gauge\n" + "\n".join(lines) + "\n# EOF\n")
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(directory / "seeded.om"),
                    str(directory / "data")], check=True, capture_output=True, timeout=120)
    server = Prometheus(directory / "data", directory / "serving")
    yield server, t0
    server.stop()


@pytest.fixture(params=["embedded", "prometheus"])
def backend(request, prometheus, settings, deployment):
    """The test's backend, the seeded series in it only (the embedded store is empty in prometheus mode)."""
    from controlplane.observability.models import TenantSample

    server, t0 = prometheus
    settings.TANDEM_METRICS_BACKEND = request.param
    settings.TANDEM_PROMETHEUS_URL = server.url
    if request.param == "embedded":
        TenantSample.objects.bulk_create([TenantSample(ts=ts, deployment_id=deployment.pk, tenant=tenant,
                                                       metric=METRIC_IDS[METRIC], value=value)
                                          for ts, tenant, value in rows(t0)])
    return t0


def test_the_rule_of_the_tenant_near_its_quota_fires_in_either_backend(backend, deployment):
    from controlplane.alerting.models import Alert, AlertRule
    from controlplane.alerting.services.evaluation import evaluate_rules
    from controlplane.alerting.services.rules import rule_create
    from controlplane.tenants.models import Tenant

    t0 = backend
    AlertRule.objects.filter(deployment=deployment).delete()  # the defaults: this test's rules only
    for tenant in LEVELS:
        Tenant.objects.create(name=tenant, tokens_per_minute=6000)
        rule_create(name=f"{tenant}-quota", deployment=deployment, role="", tenant=tenant, metric=METRIC,
                    aggregation="max", window_s=60, comparison=">=", threshold=0.9, cooldown_s=0)
    evaluate_rules(now=datetime.fromtimestamp(t0, tz=timezone.utc))
    fired = {(a.rule.name, a.labels["tenant"], a.state, round(a.value, 6)) for a in Alert.objects.all()}
    assert fired == {("acme-quota", "acme", "firing", 0.95)}


def test_the_tenant_pages_range_read_draws_the_same_points_in_either_backend(backend, deployment):
    from controlplane.observability.reader import reader

    t0 = backend
    start, step = t0 - 240, 30.0
    found = reader().tenant_range(tenant="acme", metrics=[METRIC, "qps"], start=start, end=t0, step=step)
    assert list(found) == [METRIC]  # no qps seeded: no series, not an empty one
    (series,) = found[METRIC]
    assert series["deployment_id"] == deployment.pk
    assert [point[0] for point in series["points"]] == [start + i * step for i in range(8)]
    assert all(point[1] == pytest.approx(0.95) for point in series["points"])
