"""The recording rules of the `prometheus` metrics backend: promtool accepts the file, `manage.py
tandem_recording_rules` writes it with the configured window and interval, and every series the autoscaler and the
default alert rules read has a rule."""
import re
import shutil
import subprocess

import pytest
from django.core.management import call_command

from controlplane.autoscaling.models import AutoscaleMetric
from controlplane.observability.catalog import METRICS, TENANT_METRICS, TENANT_ONLY_METRICS
from controlplane.observability.recording_rules import (BUCKET_RATE, NOT_SCRAPED, REVISION_METRICS, recorded_metrics,
                                                        rule_groups, rules, rules_file)

PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`)")
def test_promtool_accepts_the_rules_file(tmp_path):
    path = tmp_path / "tandem.yml"
    path.write_text(rules_file(window_s=30, interval_s=5))
    out = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    num_bucket_rates = sum(record.endswith(BUCKET_RATE) for record, _ in rules(window_s=30))
    num_rules = 2 * len(recorded_metrics()) + len(TENANT_METRICS) + len(REVISION_METRICS) + num_bucket_rates
    assert f"SUCCESS: {num_rules} rules found" in out.stdout


def test_the_command_writes_the_window_and_interval_of_the_settings(settings, tmp_path):
    settings.TANDEM_SCRAPE_WINDOW_S, settings.TANDEM_SCRAPE_INTERVAL_S = 20, 2
    path = tmp_path / "rules.yml"
    call_command("tandem_recording_rules", "--output", str(path))
    text = path.read_text()
    assert "    interval: 2s\n" in text
    assert "rate(tandem_time_to_first_token_seconds_bucket[20s])" in text and "[30s]" not in text


def test_every_series_the_loops_read_is_recorded_per_worker_and_per_pool():
    records = {record for record, _ in rules(window_s=30)}
    autoscaled = {metric.removesuffix("_per_worker") for metric in AutoscaleMetric.values}
    for name in autoscaled | {"qps", "error_ratio", "server_error_ratio", "up", "kv_cache_usage_ratio"}:
        assert f"tandem_worker:{name}" in records and f"tandem_pool:{name}" in records, name
    # Everything the workers export is recorded; only the control plane's own figure is not (and the quota ratios,
    # which exist per tenant only).
    assert set(METRICS) - recorded_metrics() == set(NOT_SCRAPED) | set(TENANT_ONLY_METRICS)
    assert {f"tandem_tenant:{name}" for name in TENANT_METRICS} <= records


def test_tenant_series_come_from_the_gateways_tenant_series_summed_over_gateways():
    exprs = dict(rules(window_s=30))
    buckets = "tandem_tenant:tandem_gateway_tenant_time_to_first_token_seconds_bucket:rate"
    assert exprs[buckets] == ("sum by (le, deployment, tenant) "
                              "(rate(tandem_gateway_tenant_time_to_first_token_seconds_bucket[30s]))")
    assert exprs["tandem_tenant:ttft_p99_seconds"] == f"histogram_quantile(0.99, {buckets})"
    # Limits are per gateway: the ratio is taken per gateway, then the largest.
    assert exprs["tandem_tenant:tokens_per_minute_quota_ratio"].startswith("max by (deployment, tenant) (60 * ")
    assert 'tandem_gateway_tenant_limit{limit="tokens_per_minute"}' in \
        exprs["tandem_tenant:tokens_per_minute_quota_ratio"]


def test_pool_quantiles_and_ratios_come_from_summed_series_not_worker_values():
    exprs = dict(rules(window_s=30))
    # The buckets' rate is taken once per worker; the pool's buckets are those rates summed, never quantiles averaged.
    worker_buckets = "tandem_worker:tandem_time_to_first_token_seconds_bucket:rate"
    pool_buckets = "tandem_pool:tandem_time_to_first_token_seconds_bucket:rate"
    assert exprs[worker_buckets] == (
        "sum by (le, deployment, pool, worker) (rate(tandem_time_to_first_token_seconds_bucket[30s]))")
    assert exprs[pool_buckets] == f"sum by (le, deployment, pool) ({worker_buckets})"
    assert exprs["tandem_worker:ttft_p99_seconds"] == f"histogram_quantile(0.99, {worker_buckets})"
    assert exprs["tandem_pool:ttft_p99_seconds"] == f"histogram_quantile(0.99, {pool_buckets})"
    assert exprs["tandem_pool:qps"] == "sum by (deployment, pool) (tandem_worker:qps)"
    assert "tandem_worker:" not in exprs["tandem_pool:error_ratio"]
    assert exprs["tandem_pool:kv_cache_usage_ratio"] == "avg by (deployment, pool) (tandem_worker:kv_cache_usage_ratio)"


def test_revision_series_come_from_the_gateways_revision_label_summed_over_gateways():
    from dashboards.views.rollouts import CHART_METRICS

    exprs = dict(rules(window_s=30))
    assert {f"tandem_revision:{metric}" for metric, _, _ in CHART_METRICS} <= set(exprs)
    buckets = "tandem_revision:tandem_inter_token_latency_seconds_bucket:rate"
    assert exprs[buckets] == ("sum by (le, deployment, revision) "
                              '(rate(tandem_inter_token_latency_seconds_bucket{pool="gateway", revision!=""}[30s]))')
    assert exprs["tandem_revision:itl_p99_seconds"] == f"histogram_quantile(0.99, {buckets})"
    # Workers carry their target's revision label too: only the gateway's requests count.
    assert all('pool="gateway", revision!=""' in exprs[f"tandem_revision:{name}"] for name in REVISION_METRICS
               if "_p" not in name)


def test_each_group_reads_only_what_the_groups_rules_record_before_it_or_the_scraped_series():
    """Groups run concurrently: a rule that read another group's record would see one evaluation late, or not at
    all on the first."""
    recorded = {record: group for group, records in rule_groups(window_s=30) for record, _ in records}
    for group, records in rule_groups(window_s=30):
        seen = set()
        for record, expr in records:
            for other, other_group in recorded.items():
                if re.search(rf"\b{re.escape(other)}\b", expr):
                    assert other_group == group and other in seen, (record, other)
            seen.add(record)
