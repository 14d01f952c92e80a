"""A vLLM worker's /metrics page read as Tandem's series: the control plane's parser sees the TTFT, ITL and
end-to-end histograms, running and waiting requests, KV cache use, tokens, prefix-cache hits and successes under
Tandem's names, and vLLM's aborted and failed requests as errors of the client's and the server's class."""
from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest
import requests

from controlplane.observability.exposition import parse_exposition
from inference.engines.vllm.metrics import RELABEL_CONFIGS, translate
from tests.controlplane.observability.servers import MetricsServers
from tests.procs import free_port

PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="demo"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="demo"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="demo"} 0.25
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="demo"} 120.0
vllm:prompt_tokens_created{engine="0",model_name="demo"} 1.79e+09
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="demo"} 40.0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="demo"} 120.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="demo"} 32.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="demo"} 2.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="demo"} 3.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="demo"} 1.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="demo"} 1.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="demo"} 4.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="demo"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="demo"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="demo"} 0.4
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="demo"} 35.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="demo"} 35.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{engine="0",le="1.0",model_name="demo"} 5.0
vllm:e2e_request_latency_seconds_bucket{engine="0",le="+Inf",model_name="demo"} 5.0
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="demo"} 5.0
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 7.5
"""


def test_a_vllm_page_reads_as_tandems_series():
    reading = parse_exposition(translate(PAGE))
    assert reading.gauges == {"requests_running": 3.0, "requests_waiting": 1.0, "kv_cache_usage_ratio": 0.25}
    assert reading.counters == {"success": 5.0, "errors": 2.0, "server_errors": 1.0, "prompt_tokens": 120.0,
                                "generation_tokens": 40.0, "prefix_queried_tokens": 120.0,
                                "prefix_hit_tokens": 32.0, "cpu_seconds": 7.5}
    assert reading.histograms["ttft"] == [(0.1, 4.0), (float("inf"), 5.0)]
    assert set(reading.histograms) == {"ttft", "itl", "e2e"}


def test_a_page_without_vllm_series_is_left_as_it_is():
    tandem = "# TYPE tandem_requests_running gauge\ntandem_requests_running{role=\"decode\"} 1.0\n"
    assert translate(tandem) is tandem


def test_a_real_prometheus_renames_a_vllm_page_with_the_documented_relabelling(tmp_path):
    """The `metric_relabel_configs` docs/engines.md gives for a Prometheus that scrapes vLLM workers itself, in a
    real Prometheus scraping a vLLM page: the same names the embedded scraper reads, so the recording rules and the
    Grafana dashboard cover both engines."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        pytest.skip("prometheus not installed (Debian package `prometheus`)")
    servers = MetricsServers()
    page_port = servers.serve(lambda: (200, PAGE.encode()))
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"}, "scrape_configs": [{
        "job_name": "tandem", "static_configs": [{"targets": [f"127.0.0.1:{page_port}"], "labels": {"engine": "vllm"}}],
        "metric_relabel_configs": RELABEL_CONFIGS}]}
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))
    port = free_port()
    proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    def query(expr: str) -> dict:
        try:
            answer = requests.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": expr}, timeout=2).json()
        except (requests.RequestException, ValueError):
            return {}
        return {tuple(sorted(r["metric"].items())): float(r["value"][1]) for r in answer["data"]["result"]}

    try:
        deadline = time.monotonic() + 60
        while not query("tandem_requests_running"):
            assert proc.poll() is None and time.monotonic() < deadline, "no renamed series within 60 s"
            time.sleep(0.5)
        assert list(query("tandem_requests_running").values()) == [3.0]
        assert list(query("tandem_kv_cache_usage_ratio").values()) == [0.25]
        assert list(query('tandem_time_to_first_token_seconds_bucket{le="0.1"}').values()) == [4.0]
        assert list(query("sum(tandem_request_success_total)").values()) == [5.0]
        errors = {dict(k)["kind"]: v for k, v in query("tandem_request_errors_total").items()}
        assert errors == {"client_disconnected": 1.0, "engine": 1.0}
        assert list(query("tandem_prompt_tokens_total").values()) == [120.0]
        assert not query('{__name__=~"vllm:(num_requests_running|time_to_first_token_seconds_bucket)"}')
    finally:
        proc.terminate()
        proc.wait(15)
