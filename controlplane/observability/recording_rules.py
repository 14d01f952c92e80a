"""The Prometheus recording rules that the `prometheus` metrics backend reads (observability/promql.py): each stored
series of the catalog that Prometheus can compute, per worker and per pool, the way the embedded store computes it
(observability/derive.py and store._pool_values).

    tandem_worker:<catalog name>{deployment, pool, worker}
    tandem_pool:<catalog name>{deployment, pool}

`deployment`, `pool` and `worker` are the target labels of Tandem's HTTP service discovery (prometheus.sd_targets).
Rates and quantiles are over TANDEM_SCRAPE_WINDOW_S, like the embedded store's; pool quantiles come from the summed
bucket rates of the pool's workers and pool ratios from its summed counters (never an average of worker values);
utilisation-like series are the mean of the pool's workers (catalog.PoolAggregate). The rules are evaluated every
TANDEM_SCRAPE_INTERVAL_S, so that `sum_over_time`/`count_over_time` over a window count what the embedded store
counts. `unschedulable_replicas` is the control plane's own figure (not scraped): the reader takes it from the
Pool rows.

`manage.py tandem_recording_rules` writes the file; `promtool check rules` checks it (tests).
"""
from __future__ import annotations

import functools

from controlplane.observability.catalog import POOL_AGGREGATES, QUANTILES, STORED_HISTOGRAMS, PoolAggregate
from controlplane.observability.exposition import CLIENT_ERROR_KINDS

WORKER = "deployment, pool, worker"
POOL = "deployment, pool"
WORKER_PREFIX = "tandem_worker:"
POOL_PREFIX = "tandem_pool:"
NOT_SCRAPED = ("unschedulable_replicas",)

_REQUESTS = '{__name__=~"tandem_request_success_total|tandem_request_errors_total"}'
# Gauges: (source series, how a worker's several label sets combine: per GPU, per queue class).
_GAUGES = {
    "requests_running": ("tandem_requests_running", "sum"),
    "requests_waiting": ("tandem_requests_waiting", "sum"),
    "kv_cache_usage_ratio": ("tandem_kv_cache_usage_ratio", "max"),
    "gpu_utilization_ratio": ("tandem_gpu_utilization_ratio", "max"),
    "gpu_memory_used_bytes": ("tandem_gpu_memory_used_bytes", "sum"),
    "gpu_temperature_celsius": ("tandem_gpu_temperature_celsius", "max"),
    "gpu_power_watts": ("tandem_gpu_power_watts", "sum"),
    "gpu_memory_fragmentation_bytes": ("tandem_gpu_memory_fragmentation_bytes", "sum"),
    "resident_memory_bytes": ("process_resident_memory_bytes", "sum"),
    "queue_length": ("tandem_gateway_queue_length", "sum"),
    "prefill_roofline_ratio": ("tandem_prefill_roofline_ratio", "max"),
    "decode_roofline_ratio": ("tandem_decode_roofline_ratio", "max"),
}
_RATES = {
    "prompt_tokens_per_second": "tandem_prompt_tokens_total",
    "generation_tokens_per_second": "tandem_generation_tokens_total",
    "cpu_usage_ratio": "process_cpu_seconds_total",
    "prefix_cache_hit_tokens_per_second": "tandem_prefix_cache_hit_tokens_total",
    "spec_proposed_tokens_per_second": "tandem_spec_decode_proposed_tokens_total",
    "spec_accepted_tokens_per_second": "tandem_spec_decode_accepted_tokens_total",
}
# Counter ratios: (numerator, denominator), both summed over the scope before dividing.
_RATIOS = {
    "batch_tokens_per_step": ("tandem_batch_tokens_per_step_sum", "tandem_batch_tokens_per_step_count"),
    "prefix_cache_hit_ratio": ("tandem_prefix_cache_hit_tokens_total", "tandem_prefix_cache_queried_tokens_total"),
    "spec_acceptance_ratio": ("tandem_spec_decode_accepted_tokens_total", "tandem_spec_decode_proposed_tokens_total"),
}


def _rate(selector: str, by: str, window: str) -> str:
    return f"sum by ({by}) (rate({selector}[{window}]))"


def _error_ratio(by: str, window: str, errors: str) -> str:
    # No error series yet (a counter with labels appears at its first increment) is 0 errors, not no data.
    return (f"({_rate(errors, by, window)} or 0 * {_rate('tandem_request_success_total', by, window)}) "
            f"/ {_rate(_REQUESTS, by, window)}")


def _scoped(name: str, by: str, window: str) -> str | None:
    """The expression of one catalog series computed straight from the scraped series, summed over `by` (a worker
    or a pool): histograms, rates and counter ratios, which pool from summed counters. None: not of this kind."""
    for prefix, histogram in STORED_HISTOGRAMS.items():
        for label, q in QUANTILES.items():
            if name == f"{prefix}_{label}_seconds":
                return f"histogram_quantile({q}, sum by (le, {by}) (rate({histogram}_bucket[{window}])))"
    if name == "qps":
        return _rate(_REQUESTS, by, window)
    if name == "error_ratio":
        return _error_ratio(by, window, "tandem_request_errors_total")
    if name == "server_error_ratio":
        client = "|".join(sorted(CLIENT_ERROR_KINDS))
        return _error_ratio(by, window, f'tandem_request_errors_total{{kind!~"{client}"}}')
    if name in _RATES:
        return _rate(_RATES[name], by, window)
    if name in _RATIOS:
        numerator, denominator = _RATIOS[name]
        return f"{_rate(numerator, by, window)} / {_rate(denominator, by, window)}"
    return None


def _worker_expr(name: str, window: str) -> str | None:
    scoped = _scoped(name, WORKER, window)
    if scoped is not None:
        return scoped
    if name in _GAUGES:
        series, combine = _GAUGES[name]
        return f"{combine} by ({WORKER}) ({series})"
    if name == "gpu_memory_used_ratio":
        return (f"sum by ({WORKER}) (tandem_gpu_memory_used_bytes) "
                f"/ sum by ({WORKER}) (tandem_gpu_memory_total_bytes)")
    if name == "up":
        return f"max by ({WORKER}) (up)"
    return None


def _pool_expr(name: str, window: str) -> str | None:
    how = POOL_AGGREGATES[name]
    if how in (PoolAggregate.HISTOGRAM, PoolAggregate.COUNTER_RATIO) or name == "qps" or name in _RATES:
        return _scoped(name, POOL, window)
    combine = {PoolAggregate.SUM: "sum", PoolAggregate.MEAN: "avg", PoolAggregate.MAX: "max"}[how]
    return f"{combine} by ({POOL}) ({WORKER_PREFIX}{name})"


def rules(*, window_s: int) -> list[tuple[str, str]]:
    """(record, expr) of every rule, worker rules first (pool rules of gauges read them)."""
    window = f"{int(window_s)}s"
    worker, pool = [], []
    for name in POOL_AGGREGATES:
        if name in NOT_SCRAPED:
            continue
        expr = _worker_expr(name, window)
        if expr is None:
            continue
        worker.append((WORKER_PREFIX + name, expr))
        pool.append((POOL_PREFIX + name, _pool_expr(name, window)))
    return worker + pool


@functools.cache
def recorded_metrics() -> frozenset[str]:
    """The catalog series the rules record (the reader answers the others with no data)."""
    return frozenset(record.removeprefix(WORKER_PREFIX) for record, _ in rules(window_s=30)
                     if record.startswith(WORKER_PREFIX))


def rules_file(*, window_s: int, interval_s: int) -> str:
    """The rule file (YAML) for Prometheus' `rule_files`: one group, whose rules Prometheus evaluates in order, so
    that the pool rules of gauges read the worker rules of the same evaluation."""
    lines = ["# Generated by `manage.py tandem_recording_rules` (controlplane/observability/recording_rules.py).",
             "groups:", "  - name: tandem", f"    interval: {int(interval_s)}s", "    rules:"]
    for record, expr in rules(window_s=window_s):
        lines += [f"      - record: {record}", f"        expr: '{expr.replace(chr(39), chr(39) * 2)}'"]
    return "\n".join(lines) + "\n"
