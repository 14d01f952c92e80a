"""The Prometheus recording rules that the `prometheus` metrics backend reads (observability/promql.py): each stored
series of the catalog that Prometheus can compute, per worker and per pool, the way the embedded store computes it
(observability/derive.py and store._pool_values).

    tandem_worker:<catalog name>{deployment, pool, worker}
    tandem_pool:<catalog name>{deployment, pool}
    tandem_tenant:<catalog name>{deployment, tenant}   (catalog.TENANT_METRICS, from the gateways' tenant series)
    tandem_revision:<catalog name>{deployment, revision}   (REVISION_METRICS, from the gateways' request series)

`deployment`, `pool` and `worker` are the target labels of Tandem's HTTP service discovery (prometheus.sd_targets).
Rates and quantiles are over TANDEM_SCRAPE_WINDOW_S, like the embedded store's; pool quantiles come from the summed
bucket rates of the pool's workers and pool ratios from its summed counters (never an average of worker values);
utilisation-like series are the mean of the pool's workers (catalog.PoolAggregate). The rules are evaluated every
TANDEM_SCRAPE_INTERVAL_S, so that `sum_over_time`/`count_over_time` over a window count what the embedded store
counts. `unschedulable_replicas` is the control plane's own figure (not scraped): the reader takes it from the
Pool rows.

The rules come in groups, which Prometheus evaluates concurrently (the rules of one group in order, each reading what
the rules before it recorded in the same evaluation). A histogram's bucket rates are the expensive part (one series
per bucket, worker and label set: ~50 per worker, 50,000 at 1,000 workers), so each histogram has a group of its own
that takes the rate of its buckets once, per worker, into `tandem_worker:<histogram>_bucket:rate`, sums that per pool
into `tandem_pool:<histogram>_bucket:rate`, and reads every quantile of either scope from those (the same sums of the
same rates as before, not an average of quantiles). Tenant and revision quantiles are built the same way from
`tandem_tenant:`/`tandem_revision:<histogram>_bucket:rate`. A pool's rates are the sum of its workers' recorded
rates; its ratios still come from its summed counters. These `..._bucket:rate` series are intermediate: no reader
asks for them.

`manage.py tandem_recording_rules` writes the file; `promtool check rules` checks it (tests).
"""
from __future__ import annotations

import functools

from controlplane.observability.catalog import (HISTOGRAMS, POOL_AGGREGATES, QUANTILES, STORED_HISTOGRAMS,
                                                TENANT_HISTOGRAMS, TENANT_METRICS, TENANT_ONLY_METRICS, PoolAggregate)
from controlplane.observability.exposition import CLIENT_ERROR_KINDS

WORKER = "deployment, pool, worker"
POOL = "deployment, pool"
WORKER_PREFIX = "tandem_worker:"
POOL_PREFIX = "tandem_pool:"
TENANT = "deployment, tenant"
TENANT_PREFIX = "tandem_tenant:"
NOT_SCRAPED = ("unschedulable_replicas",)
REVISION = "deployment, revision"
REVISION_PREFIX = "tandem_revision:"
# A revision's request series, from the gateways' `revision`-labelled metrics (what store._revision_rows keeps per
# revision, and what the rollout and A/B pages chart).
REVISION_METRICS = (*(f"{prefix}_{label}_seconds" for prefix in HISTOGRAMS for label in QUANTILES),
                    "qps", "error_ratio", "server_error_ratio")
BUCKET_RATE = "_bucket:rate"  # <level prefix><histogram>_bucket:rate: a level's bucket rates, read by its quantiles
REVISION_GATEWAY = 'pool="gateway", revision!=""'

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


def _histogram_rules(level: str, by: str, histogram: str, key: str, source: str, names) -> list[tuple[str, str]]:
    """One histogram's rules at one level: its bucket rates summed over `by` from `source` (a rate of the scraped
    buckets, or the recorded bucket rates of the level below), recorded once, then each quantile of `names` from
    them, so that the buckets are read once per level rather than once per quantile."""
    buckets = f"{level}{histogram}{BUCKET_RATE}"
    quantiles = [(f"{level}{key}_{label}_seconds", f"histogram_quantile({q}, {buckets})")
                 for label, q in QUANTILES.items() if f"{key}_{label}_seconds" in names]
    return [(buckets, f"sum by (le, {by}) ({source})"), *quantiles] if quantiles else []


def _is_quantile(name: str, histograms: dict[str, str]) -> bool:
    return any(name == f"{key}_{label}_seconds" for key in histograms for label in QUANTILES)


def _scoped(name: str, by: str, window: str) -> str | None:
    """The expression of one catalog series computed straight from the scraped series, summed over `by` (a worker
    or a pool): rates and counter ratios, which pool from summed counters. None: not of this kind."""
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
    if how == PoolAggregate.COUNTER_RATIO:
        return _scoped(name, POOL, window)
    if name == "qps" or name in _RATES:  # a sum of the workers' sums of rates: the pool's sum of rates
        return f"sum by ({POOL}) ({WORKER_PREFIX}{name})"
    combine = {PoolAggregate.SUM: "sum", PoolAggregate.MEAN: "avg", PoolAggregate.MAX: "max"}[how]
    return f"{combine} by ({POOL}) ({WORKER_PREFIX}{name})"


def _tenant_expr(name: str, window: str) -> str:
    """A tenant's series over its deployment's gateways, as tenant_rates.py computes it: rates from the summed
    counters (quantiles from the summed buckets: _histogram_rules); a quota ratio at the gateway where the tenant ran
    closest to its limit."""
    requests, tokens = "tandem_gateway_tenant_requests_total", "tandem_gateway_tenant_tokens_total"
    simple = {"qps": _rate(requests, TENANT, window),
              "error_ratio": f"{_rate('tandem_gateway_tenant_errors_total', TENANT, window)} "
                             f"/ {_rate(requests, TENANT, window)}",
              "prompt_tokens_per_second": _rate(f'{tokens}{{kind="prompt"}}', TENANT, window),
              "generation_tokens_per_second": _rate(f'{tokens}{{kind="completion"}}', TENANT, window)}
    if name in simple:
        return simple[name]
    gateway = "deployment, worker, tenant"
    counted = {"tokens_per_minute_quota_ratio": (tokens, "tokens_per_minute"),
               "requests_per_minute_quota_ratio": (requests, "requests_per_minute")}[name]
    return (f"max by ({TENANT}) (60 * {_rate(counted[0], gateway, window)} / on ({gateway}) "
            f'max by ({gateway}) (tandem_gateway_tenant_limit{{limit="{counted[1]}"}}))')


def _revision_expr(name: str, window: str) -> str:
    """A revision's series over its deployment's gateways, from the `revision` label the gateway puts on its request
    metrics (http_sd gives a gateway's target an empty `revision`, so the gateway's own survives). Workers' series
    carry their target's `revision` too: `pool="gateway"` keeps to what the gateway saw, as the embedded store does
    (quantiles from the summed buckets of the same series: _histogram_rules)."""
    on = REVISION_GATEWAY
    success = f"tandem_request_success_total{{{on}}}"
    requests = _rate(f'{{__name__=~"tandem_request_success_total|tandem_request_errors_total", {on}}}', REVISION,
                     window)
    if name == "qps":
        return requests
    kinds = "" if name == "error_ratio" else f', kind!~"{"|".join(sorted(CLIENT_ERROR_KINDS))}"'
    errors = _rate(f"tandem_request_errors_total{{{on}{kinds}}}", REVISION, window)
    return f"({errors} or 0 * {_rate(success, REVISION, window)}) / {requests}"


def rule_groups(*, window_s: int) -> list[tuple[str, list[tuple[str, str]]]]:
    """(group name, [(record, expr)]) of every group. Each histogram's group takes its buckets' rate once and builds
    the worker and pool quantiles on it; `tandem` has the other worker series, then the pool series (a pool's gauges
    and rates read its workers' of the same evaluation); tenants and revisions (the gateways' series) have their own."""
    window = f"{int(window_s)}s"
    names = [name for name in POOL_AGGREGATES if name not in NOT_SCRAPED and name not in TENANT_ONLY_METRICS]
    groups = []
    for key, histogram in STORED_HISTOGRAMS.items():
        worker = _histogram_rules(WORKER_PREFIX, WORKER, histogram, key, f"rate({histogram}_bucket[{window}])", names)
        pool = _histogram_rules(POOL_PREFIX, POOL, histogram, key, f"{WORKER_PREFIX}{histogram}{BUCKET_RATE}", names)
        groups.append((f"tandem_{key}", worker + pool))
    worker, pool = [], []
    for name in names:
        expr = None if _is_quantile(name, STORED_HISTOGRAMS) else _worker_expr(name, window)
        if expr is not None:
            worker.append((WORKER_PREFIX + name, expr))
            pool.append((POOL_PREFIX + name, _pool_expr(name, window)))
    groups.append(("tandem", worker + pool))
    tenant = [rule for key, histogram in TENANT_HISTOGRAMS.items() for rule in _histogram_rules(
        TENANT_PREFIX, TENANT, histogram, key, f"rate({histogram}_bucket[{window}])", TENANT_METRICS)]
    groups.append(("tandem_tenant", tenant + [(TENANT_PREFIX + name, _tenant_expr(name, window))
                                              for name in TENANT_METRICS if not _is_quantile(name, TENANT_HISTOGRAMS)]))
    revision = [rule for key, histogram in HISTOGRAMS.items() for rule in _histogram_rules(
        REVISION_PREFIX, REVISION, histogram, key, f"rate({histogram}_bucket{{{REVISION_GATEWAY}}}[{window}])",
        REVISION_METRICS)]
    groups.append(("tandem_revision", revision + [(REVISION_PREFIX + name, _revision_expr(name, window))
                                                  for name in REVISION_METRICS if not _is_quantile(name, HISTOGRAMS)]))
    return groups


def rules(*, window_s: int) -> list[tuple[str, str]]:
    """(record, expr) of every rule of every group, the intermediate bucket rates included."""
    return [rule for _, group in rule_groups(window_s=window_s) for rule in group]


@functools.cache
def recorded_metrics() -> frozenset[str]:
    """The catalog series the rules record (the reader answers the others with no data)."""
    return frozenset(record.removeprefix(WORKER_PREFIX) for record, _ in rules(window_s=30)
                     if record.startswith(WORKER_PREFIX) and not record.endswith(BUCKET_RATE))


def rules_file(*, window_s: int, interval_s: int) -> str:
    """The rule file (YAML) for Prometheus' `rule_files`: the groups of rule_groups, each evaluated every interval."""
    lines = ["# Generated by `manage.py tandem_recording_rules` (controlplane/observability/recording_rules.py).",
             "groups:"]
    for name, group in rule_groups(window_s=window_s):
        lines += [f"  - name: {name}", f"    interval: {int(interval_s)}s", "    rules:"]
        for record, expr in group:
            lines += [f"      - record: {record}", f"        expr: '{expr.replace(chr(39), chr(39) * 2)}'"]
    return "\n".join(lines) + "\n"
