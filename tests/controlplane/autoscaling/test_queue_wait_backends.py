"""The queue wait signal with the `prometheus` metrics backend: the recording rules record the gateway's queue wait
and length per pool, as the embedded store keeps them, and the autoscaler reads them from a real Prometheus."""
import time

import pytest

from controlplane.autoscaling.autoscaler import autoscale_pool, policy_for
from controlplane.autoscaling.models import AutoscalingPolicy
from controlplane.models import Pool
from controlplane.observability.models import Sample
from controlplane.observability.recording_rules import rules
from tests.controlplane.observability.seeded_prometheus import PROMETHEUS, PROMTOOL, serving


def test_the_recording_rules_record_the_gateway_queue_per_pool():
    exprs = dict(rules(window_s=30))
    buckets = "tandem_pool:tandem_gateway_queue_wait_seconds_bucket:rate"
    assert exprs[buckets] == ("sum by (le, deployment, pool) "
                              "(tandem_worker:tandem_gateway_queue_wait_seconds_bucket:rate)")
    assert exprs["tandem_pool:queue_wait_p99_seconds"] == f"histogram_quantile(0.99, {buckets})"
    assert exprs["tandem_worker:queue_length"] == "sum by (deployment, pool, worker) (tandem_gateway_queue_length)"
    assert exprs["tandem_pool:queue_length"] == "sum by (deployment, pool) (tandem_worker:queue_length)"


@pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                    reason="prometheus/promtool not installed (Debian package `prometheus`)")
def test_with_prometheus_the_autoscaler_reads_the_gateway_queue(deployment, make_worker, settings, tmp_path):
    deployment.autoscale_enabled = True
    deployment.save()
    make_worker(deployment, "decode")
    pool = Pool.objects.select_related("deployment").get(deployment=deployment, role="decode")
    AutoscalingPolicy.objects.filter(pk=policy_for(pool).pk).update(queue_wait_target=0.5)
    now = float(int(time.time()))
    rows = [(now - age, metric, role, None, value) for age in (12, 7, 2)
            for metric, role, value in [("itl_p99_seconds", "decode", 0.05),
                                        ("queue_wait_p99_seconds", "gateway", 2.3),
                                        ("queue_length", "gateway", 4.0)]]
    prometheus = serving(rows, tmp_path)
    try:
        settings.TANDEM_METRICS_BACKEND, settings.TANDEM_PROMETHEUS_URL = "prometheus", prometheus.url
        decision = autoscale_pool(pool, now=now)
    finally:
        prometheus.stop()
    assert not Sample.objects.exists()  # what the autoscaler read came from Prometheus
    assert decision.desired == 3, decision.reason
    assert "queue wait P99 2.3 s > target 0.5 s" in decision.reason
    assert "itl_p99_seconds 0.05 vs target 0.1" in decision.reason
