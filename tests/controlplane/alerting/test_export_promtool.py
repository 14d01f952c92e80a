"""GET /api/v1/alert-rules/export?format=prometheus is a rule file that `promtool check rules` accepts.

promtool comes with Debian's `prometheus` package (apt-get install prometheus)."""
import shutil
import subprocess

import pytest
import yaml

PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`)")
def test_promtool_accepts_the_exported_default_and_custom_rules(deployment, make_rule, viewer_api, tmp_path):
    make_rule(deployment, name="itl-slow", role="decode", per_worker=True, metric="itl_p99_seconds",
              aggregation="avg", comparison=">=", threshold=0.25, for_s=30, keep_firing_for_s=60,
              labels={"team": "serving"}, annotations={"summary": "ITL of {{ $labels.instance }} is {{ $value }}"})
    make_rule(None, name="any-kv-full", role="", metric="kv_cache_usage_ratio", aggregation="max",
              comparison=">", threshold=0.95)
    make_rule(deployment, name="prefill-batches-small", role="prefill", metric="batch_tokens_per_step",
              aggregation="avg", comparison="<", threshold=16)
    make_rule(deployment, name="decode-fragmented", role="decode", metric="gpu_memory_fragmentation_bytes",
              aggregation="max", comparison=">", threshold=2 ** 30)
    response = viewer_api.get("/api/v1/alert-rules/export?format=prometheus")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/yaml")
    text = response.content.decode()
    path = tmp_path / "tandem-rules.yml"
    path.write_text(text)
    check = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    exported = yaml.safe_load(text)["groups"][0]["rules"]
    assert f"SUCCESS: {len(exported)} rules found" in check.stdout  # promtool read every rule we wrote

    rules = {r["labels"]["tandem_rule"]: r for r in exported if "loop" not in r["labels"]}
    loops = {r["labels"]["loop"]: r for r in exported if "loop" in r["labels"]}
    assert len(rules) + len(loops) == len(exported)
    assert len(rules) >= 18  # the deployment's defaults (14, roofline's two among them) + 4 here
    # The fleet's control-loop rule (migration 0005): one rule per periodic pass over the control plane's /metrics.
    assert set(loops) == {"reconcile", "health", "scrape", "alert_evaluation"}
    assert loops["reconcile"]["labels"]["tandem_rule"] == "control-plane:control-loop-stale"
    assert loops["reconcile"]["alert"] == "control_plane_control_loop_stale_reconcile"
    assert loops["reconcile"]["expr"] == ('(time() - tandem_controlplane_cycle_last_run_timestamp_seconds'
                                          '{kind="reconcile"}) / 30 > 1.0')
    assert {"demo:prefill-roofline", "demo:decode-roofline", "itl-slow", "any-kv-full"} <= set(rules)
    assert rules["demo:p99-latency"]["expr"] == (
        'histogram_quantile(0.99, sum by (le, role) (rate(tandem_e2e_request_latency_seconds_bucket'
        '{role="gateway",model="demo"}[60s]))) > 60.0')
    assert rules["demo:p99-latency"]["for"] == "60s"
    assert "offset 3600s" in rules["demo:qps-drop"]["expr"]
    # The stage rules read their own pool, with the objective as a plain threshold.
    assert rules["demo:prefill-ttft"]["expr"] == (
        'histogram_quantile(0.99, sum by (le, role) (rate(tandem_time_to_first_token_seconds_bucket'
        '{role="prefill",deployment="demo"}[60s]))) > 10.0')
    assert 'tandem_inter_token_latency_seconds_bucket{role="decode"' in rules["demo:decode-itl"]["expr"]
    assert "tandem_generation_tokens_total" in rules["demo:decode-tokens-drop"]["expr"]
    assert "offset 3600s" in rules["demo:decode-tokens-drop"]["expr"]
    assert rules["demo:kv-usage"]["expr"].startswith("avg by (role) (min_over_time(tandem_kv_cache_usage_ratio")
    assert rules["demo:kv-usage"]["for"] == "300s"
    assert "rate(tandem_batch_tokens_per_step_sum" in rules["prefill-batches-small"]["expr"]
    assert "rate(tandem_batch_tokens_per_step_count" in rules["prefill-batches-small"]["expr"]
    assert "tandem_gpu_memory_fragmentation_bytes" in rules["decode-fragmented"]["expr"]
    assert rules["itl-slow"]["keep_firing_for"] == "60s"
    assert rules["itl-slow"]["expr"].startswith("histogram_quantile(0.99, sum by (le, instance, role)")
    assert 'deployment="demo"' in rules["itl-slow"]["expr"]
    assert rules["itl-slow"]["labels"]["team"] == "serving"


def test_an_unknown_export_format_is_refused(viewer_api):
    response = viewer_api.get("/api/v1/alert-rules/export?format=grafana")
    assert response.status_code == 400
    assert "format must be 'prometheus'" in response.content.decode()
