"""The derived series the control plane stores: their names, stable ids and how a pool aggregates its workers.

Stored series are keyed (deployment, role, worker or None for the pool aggregate, metric). The id of a metric is
what the tables store (a small integer instead of a 30-character name in millions of rows); ids are stable: never
renumber one, only append.

Pool aggregates (worker None) combine the workers of one (deployment, role) at the same scrape:
- latency quantiles: computed from the *summed* bucket increases of all workers (Prometheus'
  `histogram_quantile(q, sum by (le) (rate(x_bucket[w])))`), never an average of per-worker quantiles;
- rates and counts (qps, tokens/s, requests running/waiting, bytes, watts): sum over workers;
- ratios of counters (error_ratio, server_error_ratio): from the summed counters;
- utilisation-like ratios (kv cache, GPU utilisation, GPU memory ratio, CPU, roofline ratios): mean over workers
  that report them;
- batch tokens per step: summed token counts over summed step counts;
- temperature: max; `up`: the fraction of the pool's targets that answered (1.0 all up, 0.0 all down).

Per-GPU series aggregate per worker: max for utilisation and temperature, sum for memory bytes and watts, and the
memory ratio is sum(used) / sum(total).
"""
from __future__ import annotations

import enum


class PoolAggregate(str, enum.Enum):
    HISTOGRAM = "histogram"  # recomputed from summed buckets
    SUM = "sum"
    MEAN = "mean"
    MAX = "max"
    COUNTER_RATIO = "counter_ratio"  # recomputed from summed counters


# name -> (stable id, pool aggregation, unit for the API)
_CATALOG: dict[str, tuple[int, PoolAggregate, str]] = {
    "ttft_p50_seconds": (1, PoolAggregate.HISTOGRAM, "seconds"),
    "ttft_p90_seconds": (2, PoolAggregate.HISTOGRAM, "seconds"),
    "ttft_p99_seconds": (3, PoolAggregate.HISTOGRAM, "seconds"),
    "itl_p50_seconds": (4, PoolAggregate.HISTOGRAM, "seconds"),
    "itl_p90_seconds": (5, PoolAggregate.HISTOGRAM, "seconds"),
    "itl_p99_seconds": (6, PoolAggregate.HISTOGRAM, "seconds"),
    "e2e_p50_seconds": (7, PoolAggregate.HISTOGRAM, "seconds"),
    "e2e_p90_seconds": (8, PoolAggregate.HISTOGRAM, "seconds"),
    "e2e_p99_seconds": (9, PoolAggregate.HISTOGRAM, "seconds"),
    "qps": (10, PoolAggregate.SUM, "requests/second"),
    "prompt_tokens_per_second": (11, PoolAggregate.SUM, "tokens/second"),
    "generation_tokens_per_second": (12, PoolAggregate.SUM, "tokens/second"),
    "error_ratio": (13, PoolAggregate.COUNTER_RATIO, "ratio"),
    "server_error_ratio": (14, PoolAggregate.COUNTER_RATIO, "ratio"),
    "requests_running": (15, PoolAggregate.SUM, "requests"),
    "requests_waiting": (16, PoolAggregate.SUM, "requests"),
    "kv_cache_usage_ratio": (17, PoolAggregate.MEAN, "ratio"),
    "gpu_utilization_ratio": (18, PoolAggregate.MEAN, "ratio"),
    "gpu_memory_used_bytes": (19, PoolAggregate.SUM, "bytes"),
    "gpu_memory_used_ratio": (20, PoolAggregate.MEAN, "ratio"),
    "gpu_temperature_celsius": (21, PoolAggregate.MAX, "celsius"),
    "gpu_power_watts": (22, PoolAggregate.SUM, "watts"),
    "cpu_usage_ratio": (23, PoolAggregate.MEAN, "cores"),
    "resident_memory_bytes": (24, PoolAggregate.SUM, "bytes"),
    "up": (25, PoolAggregate.MEAN, "ratio"),
    # Written by the control plane itself (not scraped): workers of a pool that no node can take.
    "unschedulable_replicas": (26, PoolAggregate.SUM, "workers"),
    # torch's reserved minus allocated GPU memory (workers on CUDA only).
    "gpu_memory_fragmentation_bytes": (27, PoolAggregate.SUM, "bytes"),
    # Mean tokens fed per engine step: rate(tandem_batch_tokens_per_step_sum) / rate(..._count), pooled from the
    # summed counters like a ratio.
    "batch_tokens_per_step": (28, PoolAggregate.COUNTER_RATIO, "tokens"),
    # Prefix caching: rate(hit tokens) / rate(queried tokens), pooled from the summed counters; and the prefill
    # tokens it saved per second. (Ids from 40: other features take the next ids after 28.)
    "prefix_cache_hit_ratio": (40, PoolAggregate.COUNTER_RATIO, "ratio"),
    "prefix_cache_hit_tokens_per_second": (41, PoolAggregate.SUM, "tokens/second"),
    # Speculative decoding (decode and colocated workers): draft tokens verified and kept per second, and the
    # share kept, rate(accepted) / rate(proposed) pooled like a ratio. Ids from 40: room for other features.
    "spec_proposed_tokens_per_second": (42, PoolAggregate.SUM, "tokens/second"),
    "spec_accepted_tokens_per_second": (43, PoolAggregate.SUM, "tokens/second"),
    "spec_acceptance_ratio": (44, PoolAggregate.COUNTER_RATIO, "ratio"),
    # The gateway's admission queue (inference/gateway/admission.py), all classes and tenants together: requests
    # waiting now, and how long admitted requests waited (what a TTFT read from the workers misses). Ids from 60.
    "queue_length": (60, PoolAggregate.SUM, "requests"),
    "queue_wait_p50_seconds": (61, PoolAggregate.HISTOGRAM, "seconds"),
    "queue_wait_p90_seconds": (62, PoolAggregate.HISTOGRAM, "seconds"),
    "queue_wait_p99_seconds": (63, PoolAggregate.HISTOGRAM, "seconds"),
    # Each stage against its host's roofline (inference.roofline): prefill matmul FLOP/s / peak, decode weight bytes
    # per step / (step time x read bandwidth); workers export them once they know their host's figures. Ids from 50.
    "prefill_roofline_ratio": (50, PoolAggregate.MEAN, "ratio"),
    "decode_roofline_ratio": (51, PoolAggregate.MEAN, "ratio"),
    # Per tenant only (TenantSample, observability/tenant_rates.py): the share of a limit a tenant used over the
    # rate window, e.g. tokens per minute / its tokens_per_minute, at the gateway where it ran closest (limits are
    # per gateway). Ids from 70.
    "tokens_per_minute_quota_ratio": (70, PoolAggregate.MAX, "ratio"),
    "requests_per_minute_quota_ratio": (71, PoolAggregate.MAX, "ratio"),
}

METRICS: tuple[str, ...] = tuple(_CATALOG)
METRIC_IDS: dict[str, int] = {name: spec[0] for name, spec in _CATALOG.items()}
METRIC_NAMES: dict[int, str] = {spec[0]: name for name, spec in _CATALOG.items()}
POOL_AGGREGATES: dict[str, PoolAggregate] = {name: spec[1] for name, spec in _CATALOG.items()}
UNITS: dict[str, str] = {name: spec[2] for name, spec in _CATALOG.items()}

# The quantiles stored for each latency histogram: (metric prefix, source histogram name).
HISTOGRAMS = {
    "ttft": "tandem_time_to_first_token_seconds",
    "itl": "tandem_inter_token_latency_seconds",
    "e2e": "tandem_e2e_request_latency_seconds",
}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99}
# Histograms stored the same way that are not request latencies (a rollout's analysis reads HISTOGRAMS only).
GATEWAY_HISTOGRAMS = {"queue_wait": "tandem_gateway_queue_wait_seconds"}
STORED_HISTOGRAMS = {**HISTOGRAMS, **GATEWAY_HISTOGRAMS}

# The series stored per (deployment, tenant) from a gateway's per-tenant metrics (TenantSample): what a tenant's page
# draws and what a rule scoped to a tenant may read. The quota ratios exist only per tenant.
TENANT_METRICS = ("qps", "prompt_tokens_per_second", "generation_tokens_per_second", "error_ratio",
                  "ttft_p50_seconds", "ttft_p90_seconds", "ttft_p99_seconds", "queue_wait_p50_seconds",
                  "queue_wait_p90_seconds", "queue_wait_p99_seconds", "tokens_per_minute_quota_ratio",
                  "requests_per_minute_quota_ratio")
TENANT_ONLY_METRICS = ("tokens_per_minute_quota_ratio", "requests_per_minute_quota_ratio")
# A gateway's per-tenant histograms, stored the same way (by the tenant label): (metric prefix, source histogram).
TENANT_HISTOGRAMS = {"ttft": "tandem_gateway_tenant_time_to_first_token_seconds",
                     "queue_wait": "tandem_gateway_queue_wait_seconds"}

# The worker statuses whose /metrics are scraped, and so whose series a per-worker read always names (value None
# when silent): those that hold a process.
SCRAPED_STATUSES = ("starting", "ready", "draining")

assert len(set(METRIC_IDS.values())) == len(METRIC_IDS), "metric ids must be unique"
