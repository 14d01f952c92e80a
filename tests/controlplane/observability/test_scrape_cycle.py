"""One scrape cycle over real HTTP peers: per-worker and per-pool series, rates from two scrapes, up=0 for a dead
target, and the state that lets the next cycle (in any process) compute rates."""
import pytest
from prometheus_client import CollectorRegistry

from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Sample, ScrapeState
from controlplane.observability.series import metric_values
from controlplane.observability.store import scrape_cycle
from inference.metrics import TandemMetrics
from tests.procs import free_port

T0 = 1_800_000_000.0


def metrics_for(role):
    return TandemMetrics(role=role, model="tiny", registry=CollectorRegistry(), gpu=False)


@pytest.fixture
def fleet(deployment, make_worker, metrics_servers):
    decode_a, decode_b, prefill, gateway = (metrics_for(r) for r in ("decode", "decode", "prefill", "gateway"))
    workers = {
        "decode_a": make_worker(deployment, "decode", port=metrics_servers.serve_metrics(decode_a)),
        "decode_b": make_worker(deployment, "decode", port=metrics_servers.serve_metrics(decode_b)),
        "decode_dead": make_worker(deployment, "decode", port=free_port()),  # nothing listens there
        "prefill": make_worker(deployment, "prefill", port=metrics_servers.serve_metrics(prefill)),
        "gateway": make_worker(deployment, "gateway", port=metrics_servers.serve_metrics(gateway)),
        "pending": make_worker(deployment, "decode", status="pending"),  # no process yet: not scraped
    }
    return workers, {"decode_a": decode_a, "decode_b": decode_b, "prefill": prefill, "gateway": gateway}


def value(worker_id, metric, role="decode", deployment=None):
    rows = Sample.objects.filter(metric=METRIC_IDS[metric], worker_id=worker_id, role=role, ts=T0 + 5)
    if deployment is not None:
        rows = rows.filter(deployment_id=deployment.pk)
    values = list(rows.values_list("value", flat=True))
    return values[0] if values else None


def test_two_scrapes_give_rates_quantiles_and_pool_aggregates(deployment, fleet):
    workers, metrics = fleet
    first = scrape_cycle(now=T0)
    assert (first.num_targets, first.num_up) == (5, 4)
    assert value(workers["decode_a"].pk, "qps") is None  # one scrape: no rate yet

    # Between the scrapes: worker A serves 10 requests with 20 ms inter-token latency, B 10 + 1 failure at 200 ms.
    for _ in range(10):
        metrics["decode_a"].inter_token_latency.observe(0.02)
        metrics["decode_a"].count_success("stop")
        metrics["decode_b"].inter_token_latency.observe(0.2)
        metrics["decode_b"].count_success("length")
    metrics["decode_b"].count_error("engine")
    metrics["decode_a"].generation_tokens.inc(50)
    metrics["decode_a"].requests_running.set(3)
    metrics["decode_b"].requests_running.set(1)
    metrics["decode_a"].kv_cache_usage.set(0.5)
    metrics["decode_b"].kv_cache_usage.set(0.25)
    gateway = metrics["gateway"]
    for _ in range(3):
        gateway.count_success("stop")
    gateway.count_error("invalid_json")  # a 400: an error, not a server error
    gateway.count_error("timeout")  # a 504
    scrape_cycle(now=T0 + 5)

    a, b = workers["decode_a"].pk, workers["decode_b"].pk
    assert value(a, "qps") == pytest.approx(2.0)
    assert value(a, "generation_tokens_per_second") == pytest.approx(10.0)
    assert value(a, "itl_p50_seconds") == pytest.approx(0.015)  # 10 in (0.01, 0.02]: 0.01 + 0.01 × 5/10
    assert value(b, "qps") == pytest.approx(2.2)
    assert value(b, "error_ratio") == pytest.approx(1 / 11)
    assert value(a, "up") == 1.0 and value(workers["decode_dead"].pk, "up") == 0.0
    # The pool: quantile of the summed buckets (rank 19.8 of 20 in (0.1, 0.25]: 0.1 + 0.15 × 9.8/10)
    assert value(None, "itl_p99_seconds") == pytest.approx(0.247)
    assert value(None, "qps") == pytest.approx(4.2)
    assert value(None, "error_ratio") == pytest.approx(1 / 21)
    assert value(None, "server_error_ratio") == pytest.approx(1 / 21)  # "engine" is a server error
    assert value(None, "requests_running") == 4.0
    assert value(None, "kv_cache_usage_ratio") == pytest.approx(0.375)
    assert value(None, "up") == pytest.approx(2 / 3)
    assert value(a, "cpu_usage_ratio") is not None and value(a, "resident_memory_bytes") > 0
    g = workers["gateway"].pk
    assert value(g, "error_ratio", role="gateway") == pytest.approx(2 / 5)
    assert value(g, "server_error_ratio", role="gateway") == pytest.approx(1 / 5)
    assert not Sample.objects.filter(worker_id=workers["pending"].pk).exists()

    state = ScrapeState.objects.get(worker_id=a)
    assert [s["ts"] for s in state.snapshots["ring"]] == [T0, T0 + 5] and state.last_up
    dead = ScrapeState.objects.get(worker_id=workers["decode_dead"].pk)
    assert not dead.last_up and "Connect" in dead.last_error


def test_selectors_read_pool_and_per_worker_values_and_say_none_for_silence(deployment, fleet):
    workers, metrics = fleet
    scrape_cycle(now=T0)
    metrics["decode_a"].count_success("stop")
    scrape_cycle(now=T0 + 5)

    [pool] = metric_values(metric="qps", deployment=deployment, role="decode", window_s=10, now=T0 + 6)
    assert (pool.worker_id, pool.value, pool.deployment_name) == (None, pytest.approx(0.2), "demo")
    per_worker = metric_values(metric="up", deployment=deployment, role="decode", aggregation="min",
                               window_s=60, now=T0 + 6, per_worker=True)
    ups = {v.worker_id: v.value for v in per_worker}
    assert ups[workers["decode_dead"].pk] == 0.0 and ups[workers["decode_a"].pk] == 1.0
    [prefill] = metric_values(metric="ttft_p99_seconds", deployment=deployment, role="prefill", window_s=10,
                              now=T0 + 6)
    assert prefill.value is None and prefill.num_samples == 0  # no request: no data, not 0
    [earlier] = metric_values(metric="up", deployment=deployment, role="decode", aggregation="count",
                              window_s=3, offset_s=5, now=T0 + 6)
    assert earlier.value == 1.0  # only the first scrape lies in (T0 − 2, T0 + 1]
    [one] = metric_values(metric="requests_running", worker=workers["decode_b"], aggregation="max", window_s=60,
                          now=T0 + 6)
    assert (one.worker_id, one.role, one.value, one.num_samples) == (workers["decode_b"].pk, "decode", 0.0, 2)
    with pytest.raises(ValueError, match="unknown metric"):
        metric_values(metric="nope", deployment=deployment)


def test_a_target_answering_an_error_or_garbage_is_recorded_down(deployment, make_worker, metrics_servers):
    broken = make_worker(deployment, "decode", port=metrics_servers.serve(lambda: (500, b"boom")))
    garbage = make_worker(deployment, "decode",
                          port=metrics_servers.serve(lambda: (200, b"tandem_requests_running{ 1")))
    result = scrape_cycle(now=T0)
    assert result.num_up == 0
    assert value_at(broken.pk) == 0.0 and value_at(garbage.pk) == 0.0
    assert "HTTP 500" in ScrapeState.objects.get(worker_id=broken.pk).last_error


def value_at(worker_id):
    return Sample.objects.get(worker_id=worker_id, metric=METRIC_IDS["up"]).value
