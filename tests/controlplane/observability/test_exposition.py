"""Parsing worker and gateway exposition text: the fast path agrees with prometheus_client's parser, error kinds
split into client and server errors, GPU series combine per worker, and malformed text is refused."""
import math

import pytest
from prometheus_client import CollectorRegistry, Gauge

from controlplane.observability import exposition
from controlplane.observability.exposition import parse_exposition
from inference.metrics import TandemMetrics


@pytest.fixture
def worker_text():
    metrics = TandemMetrics(role="decode", model="tiny", registry=CollectorRegistry(), gpu=False)
    for seconds in (0.003, 0.02, 0.02, 0.3, 7.0):
        metrics.time_to_first_token.observe(seconds)
        metrics.inter_token_latency.observe(seconds / 10)
        metrics.e2e_request_latency.observe(seconds * 3)
    metrics.count_success("stop")
    metrics.count_success("length")
    metrics.count_error("engine")
    metrics.count_error("invalid_json")
    metrics.prompt_tokens.inc(42)
    metrics.generation_tokens.inc(17)
    metrics.set_engine_stats({"num_running": 3, "num_waiting": 2, "kv_usage": 0.25, "num_spec_proposed_tokens": 10,
                              "num_spec_accepted_tokens": 6})
    return metrics.render().decode()


def test_the_fast_path_reads_what_prometheus_clients_parser_reads(worker_text, monkeypatch):
    fast = parse_exposition(worker_text)
    # Force the reference path: prometheus_client's parser takes over whenever the text holds a backslash.
    reference = parse_exposition(worker_text + '# HELP x an escaped \\\\ help line\n')
    assert fast == reference
    assert fast.counters == {"success": 2.0, "errors": 2.0, "server_errors": 1.0, "prompt_tokens": 42.0,
                             "generation_tokens": 17.0, "cpu_seconds": pytest.approx(fast.counters["cpu_seconds"]),
                             "batch_steps": 0.0, "batch_tokens": 0.0,  # no engine step observed
                             "prefix_queried_tokens": 0.0, "prefix_hit_tokens": 0.0,  # nor any admission
                             "spec_proposed": 10.0, "spec_accepted": 6.0}
    assert fast.gauges["requests_running"] == 3.0 and fast.gauges["kv_cache_usage_ratio"] == 0.25
    ttft = dict(fast.histograms["ttft"])
    assert ttft[0.005] == 1.0 and ttft[0.025] == 3.0 and ttft[10.0] == 5.0 and ttft[math.inf] == 5.0


def test_series_seen_before_read_the_same_and_a_malformed_line_of_one_is_still_refused(worker_text):
    """The fast path remembers what each series line means (exposition._SERIES): the second read of a page, and
    the same lines with timestamps, read as the first; a known series with a value that is not a number, or more
    than a value and a timestamp after it, is refused as before."""
    first = parse_exposition(worker_text)
    assert parse_exposition(worker_text) == first
    stamped = "".join(f"{line} 1800000000000\n" if line and not line.startswith("#") else f"{line}\n"
                      for line in worker_text.splitlines())
    assert parse_exposition(stamped) == first
    [running] = [line for line in worker_text.splitlines() if line.startswith("tandem_requests_running{")]
    series = running.rpartition(" ")[0]
    for bad in (f"{series} three", f"{running} 1800000000000 extra"):
        with pytest.raises(ValueError):
            parse_exposition(worker_text.replace(running, bad))


def test_gpu_series_combine_max_for_utilisation_and_sum_for_memory_and_power():
    registry = CollectorRegistry()
    labels = ("role", "model", "gpu")
    util = Gauge("tandem_gpu_utilization_ratio", "u", labels, registry=registry)
    used = Gauge("tandem_gpu_memory_used_bytes", "m", labels, registry=registry)
    total = Gauge("tandem_gpu_memory_total_bytes", "t", labels, registry=registry)
    power = Gauge("tandem_gpu_power_watts", "p", labels, registry=registry)
    temp = Gauge("tandem_gpu_temperature_celsius", "c", labels, registry=registry)
    for gpu, (u, m, w, c) in enumerate([(0.5, 10e9, 200.0, 60.0), (0.9, 30e9, 300.0, 75.0)]):
        util.labels("decode", "m", str(gpu)).set(u)
        used.labels("decode", "m", str(gpu)).set(m)
        total.labels("decode", "m", str(gpu)).set(80e9)
        power.labels("decode", "m", str(gpu)).set(w)
        temp.labels("decode", "m", str(gpu)).set(c)
    from prometheus_client import generate_latest

    gauges = parse_exposition(generate_latest(registry).decode()).gauges
    assert gauges == {"gpu_utilization_ratio": 0.9, "gpu_memory_used_bytes": 40e9, "gpu_memory_total_bytes": 160e9,
                      "gpu_power_watts": 500.0, "gpu_temperature_celsius": 75.0}


@pytest.mark.parametrize("text", [
    "tandem_requests_running{ 1\n",
    'tandem_requests_running{role="decode"} one\n',
    "<html>502 Bad Gateway</html>\ntandem_requests_waiting oops\n",
    "<html>It works!</html>\n",  # some other service on the port: no Tandem series at all
])
def test_malformed_text_is_refused(text):
    with pytest.raises(ValueError):
        parse_exposition(text)


def test_every_gateway_client_error_code_is_a_client_kind():
    # The 4xx codes the gateway answers (inference/gateway) must not count as server errors.
    for code in ("invalid_json", "invalid_type", "invalid_value", "missing_required_parameter", "unsupported_value",
                 "model_not_found", "request_too_large", "overloaded", "queue_full"):
        assert code in exposition.CLIENT_ERROR_KINDS
    for code in ("timeout", "no_ready_workers", "engine", "kv_transfer", "internal", "queue_timeout"):
        assert code not in exposition.CLIENT_ERROR_KINDS


def test_the_gateways_series_by_revision_parse_and_sum_over_revisions():
    # The gateway labels its per-request series with the revision that served ("" before a group was picked); the
    # store keeps one series per target, so the revisions are summed as the label sets of one worker are.
    from inference.gateway.config import Config
    from inference.gateway.metrics import GatewayMetrics
    from inference.gateway.routing import Router

    metrics = GatewayMetrics(model="demo", router=Router(Config(port=0, colocated_urls=["http://127.0.0.1:1"])))
    for revision, seconds in (("1", 0.02), ("2", 0.3), ("2", 7.0)):
        series = metrics.requests(revision=revision)
        series.time_to_first_token.observe(seconds)
        series.prompt_tokens.inc(10)
        series.count_success("stop")
    metrics.requests(revision="2").count_error("worker_error")
    metrics.count_error("invalid_json")  # refused before a group was picked: revision ""
    text = metrics.render().decode()
    assert 'tandem_request_success_total{finished_reason="stop",model="demo",revision="2",role="gateway"} 2.0' in text
    assert 'tandem_request_errors_total{kind="invalid_json",model="demo",revision="",role="gateway"} 1.0' in text
    fast = parse_exposition(text)
    assert fast == parse_exposition(text + '# HELP x an escaped \\\\ help line\n')
    assert fast.counters["success"] == 3.0 and fast.counters["prompt_tokens"] == 30.0
    assert fast.counters["errors"] == 2.0 and fast.counters["server_errors"] == 1.0
    ttft = dict(fast.histograms["ttft"])
    assert ttft[0.025] == 1.0 and ttft[0.5] == 2.0 and ttft[math.inf] == 3.0


def test_a_callers_own_mistakes_are_client_errors_not_the_deployments():
    """A missing or wrong key, a tenant over a limit, a prompt or max_tokens past what may be asked: counted in
    error_ratio, never in server_error_ratio (which chaos templates and the 5xx rules judge)."""
    kinds = ("missing_api_key", "invalid_api_key", "rate_limit_exceeded", "max_tokens_exceeded",
             "context_length_exceeded")
    page = "".join(f'tandem_request_errors_total{{kind="{kind}"}} 2.0\n' for kind in kinds)
    page += 'tandem_request_errors_total{kind="upstream_error"} 1.0\n'
    reading = parse_exposition(page)
    assert reading.counters["errors"] == 11.0 and reading.counters["server_errors"] == 1.0
