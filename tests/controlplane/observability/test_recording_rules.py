"""The recording rules of the `prometheus` metrics backend: promtool accepts the file, `manage.py
tandem_recording_rules` writes it with the configured window and interval, and every series the autoscaler and the
default alert rules read has a rule."""
import shutil
import subprocess

import pytest
from django.core.management import call_command

from controlplane.autoscaling.models import AutoscaleMetric
from controlplane.observability.catalog import METRICS
from controlplane.observability.recording_rules import NOT_SCRAPED, recorded_metrics, rules, rules_file

PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`)")
def test_promtool_accepts_the_rules_file(tmp_path):
    path = tmp_path / "tandem.yml"
    path.write_text(rules_file(window_s=30, interval_s=5))
    out = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {2 * len(recorded_metrics())} rules found" in out.stdout


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
    # Everything the workers export is recorded; only the control plane's own figure is not.
    assert set(METRICS) - recorded_metrics() == set(NOT_SCRAPED)


def test_pool_quantiles_and_ratios_come_from_summed_series_not_worker_values():
    exprs = dict(rules(window_s=30))
    assert exprs["tandem_pool:ttft_p99_seconds"] == (
        "histogram_quantile(0.99, sum by (le, deployment, pool) "
        "(rate(tandem_time_to_first_token_seconds_bucket[30s])))")
    assert "tandem_worker:" not in exprs["tandem_pool:error_ratio"]
    assert exprs["tandem_pool:kv_cache_usage_ratio"] == "avg by (deployment, pool) (tandem_worker:kv_cache_usage_ratio)"
