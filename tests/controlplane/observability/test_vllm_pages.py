"""A vLLM worker's /metrics page read as Tandem's series: the control plane's parser sees the TTFT, ITL and
end-to-end histograms, running and waiting requests, KV cache use, tokens, prefix-cache hits and successes under
Tandem's names, and vLLM's aborted and failed requests as errors of the client's and the server's class."""
from __future__ import annotations

from controlplane.observability.exposition import parse_exposition
from inference.engines.vllm.metrics import translate

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
