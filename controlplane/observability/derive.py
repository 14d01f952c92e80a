"""From a target's recent raw counters to the stored series (catalog.METRICS). Pure functions, no Django.

A target's state (ScrapeState.snapshots, JSON) is compact because a cycle over 1,000 targets reads and writes all of
them: {"le": {histogram key: [bucket bounds]}, "ring": [snapshot, ...]} with snapshot = {"ts": unix seconds,
"c": {counter key: value}, "h": {histogram key: [cumulative counts in the order of "le"]}}. The bounds are stored once
(a worker's layout is fixed; a changed layout after a restart starts a new ring). JSON has no infinity, so the +Inf
bound is the string "+Inf". Gauges are not kept: only their current value is stored as a series.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from controlplane.observability.catalog import QUANTILES, STORED_HISTOGRAMS
from controlplane.observability.exposition import Reading
from controlplane.observability.quantiles import (aligned_bucket_increases, counter_increase, histogram_quantiles,
                                                  sum_buckets)

_RATE_COUNTERS = ("success", "errors", "server_errors", "prompt_tokens", "generation_tokens", "cpu_seconds",
                  "batch_tokens", "batch_steps", "prefix_queried_tokens", "prefix_hit_tokens", "spec_proposed",
                  "spec_accepted")
_GAUGE_SERIES = ("requests_running", "requests_waiting", "kv_cache_usage_ratio", "gpu_utilization_ratio",
                 "gpu_memory_used_bytes", "gpu_temperature_celsius", "gpu_power_watts", "resident_memory_bytes",
                 "gpu_memory_fragmentation_bytes", "prefill_roofline_ratio", "decode_roofline_ratio",
                 "queue_length")


def trim_snapshots(snapshots: list[dict], now: float, window_s: float) -> list[dict]:
    """Keep the snapshots of the window plus the newest one before it, so that the window is fully covered."""
    start = now - window_s
    first = 0
    while first + 1 < len(snapshots) and snapshots[first + 1]["ts"] <= start:
        first += 1
    return snapshots[first:]


def state_append(state: dict | None, reading: Reading, ts: float, window_s: float) -> dict:
    """The target's new state: `reading` appended to its ring, trimmed to the window."""
    le = {key: ["+Inf" if math.isinf(b) else b for b, _ in buckets] for key, buckets in reading.histograms.items()}
    ring = list(state["ring"]) if state and state.get("le") == le else []
    ring.append({"ts": ts, "c": reading.counters,
                 "h": {key: [count for _, count in buckets] for key, buckets in reading.histograms.items()}})
    return {"le": le, "ring": trim_snapshots(ring, ts, window_s)}


@dataclass(slots=True)
class Increments:
    """What a target's counters and buckets grew by over its window: the inputs of the pool aggregate."""

    span_s: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, list[tuple[float, float]]] = field(default_factory=dict)


def increments_of(state: dict) -> Increments | None:
    """None until the target has two snapshots (a rate needs two points)."""
    ring = state["ring"]
    if len(ring) < 2:
        return None
    span = ring[-1]["ts"] - ring[0]["ts"]
    if span <= 0:
        return None
    inc = Increments(span_s=span)
    for key in _RATE_COUNTERS:
        values = [s["c"][key] for s in ring if key in s["c"]]
        if len(values) == len(ring):
            inc.counters[key] = counter_increase(values)
    for key, bounds in state["le"].items():
        if key not in STORED_HISTOGRAMS:
            continue
        les = [math.inf if b == "+Inf" else float(b) for b in bounds]
        history = [s["h"][key] for s in ring if key in s["h"]]
        # One layout for the whole ring (state_append starts a new ring when it changes).
        if len(history) == len(ring) and all(len(counts) == len(les) for counts in history):
            inc.histograms[key] = aligned_bucket_increases(les, history)
    return inc


def rate_series(inc: Increments) -> dict[str, float | None]:
    """Rates, ratios and latency quantiles of one target (or, with summed increments, of a pool)."""
    values: dict[str, float | None] = {}
    counters, span = inc.counters, inc.span_s
    for key, buckets in inc.histograms.items():
        for label, value in zip(QUANTILES, histogram_quantiles(tuple(QUANTILES.values()), buckets)):
            values[f"{key}_{label}_seconds"] = value
    if "success" in counters and "errors" in counters:
        requests = counters["success"] + counters["errors"]
        values["qps"] = requests / span
        values["error_ratio"] = counters["errors"] / requests if requests else None
        values["server_error_ratio"] = counters.get("server_errors", 0.0) / requests if requests else None
    if "prompt_tokens" in counters:
        values["prompt_tokens_per_second"] = counters["prompt_tokens"] / span
    if "generation_tokens" in counters:
        values["generation_tokens_per_second"] = counters["generation_tokens"] / span
    if "cpu_seconds" in counters:
        values["cpu_usage_ratio"] = counters["cpu_seconds"] / span
    if counters.get("batch_steps"):
        # No step in the window is no data, not 0 tokens per step.
        values["batch_tokens_per_step"] = counters.get("batch_tokens", 0.0) / counters["batch_steps"]
    if counters.get("prefix_queried_tokens"):
        # No admission in the window is no data, not a 0% hit rate.
        values["prefix_cache_hit_ratio"] = counters.get("prefix_hit_tokens", 0.0) / counters["prefix_queried_tokens"]
    if "prefix_hit_tokens" in counters:
        values["prefix_cache_hit_tokens_per_second"] = counters["prefix_hit_tokens"] / span
    if "spec_proposed" in counters:
        # Speculative decoding: drafts verified and kept per second, and the share kept (no draft: no ratio).
        values["spec_proposed_tokens_per_second"] = counters["spec_proposed"] / span
        values["spec_accepted_tokens_per_second"] = counters.get("spec_accepted", 0.0) / span
        if counters["spec_proposed"]:
            values["spec_acceptance_ratio"] = counters.get("spec_accepted", 0.0) / counters["spec_proposed"]
    return values


def gauge_series(gauges: dict[str, float]) -> dict[str, float]:
    values = {key: gauges[key] for key in _GAUGE_SERIES if key in gauges}
    total = gauges.get("gpu_memory_total_bytes")
    if total and "gpu_memory_used_bytes" in gauges:
        values["gpu_memory_used_ratio"] = gauges["gpu_memory_used_bytes"] / total
    return values


def target_series(state: dict, gauges: dict[str, float]) -> tuple[dict[str, float | None], Increments | None]:
    """The stored series of one target that answered: its current gauges and the rates over its state's ring."""
    values: dict[str, float | None] = {"up": 1.0}
    values.update(gauge_series(gauges))
    inc = increments_of(state)
    if inc is not None:
        values.update(rate_series(inc))
    return values, inc


def pool_increments(increments: list[Increments]) -> Increments | None:
    """Sum the workers' increments (`sum by (le)` for buckets). The span is the mean span: each worker's rate is
    over its own window, and summing rates equals summing increments over a common span only approximately."""
    if not increments:
        return None
    pool = Increments(span_s=sum(i.span_s for i in increments) / len(increments))
    for key in _RATE_COUNTERS:
        parts = [i.counters[key] for i in increments if key in i.counters]
        if parts:
            pool.counters[key] = sum(parts)
    for key in STORED_HISTOGRAMS:
        parts = [i.histograms[key] for i in increments if i.histograms.get(key)]
        if parts:
            pool.histograms[key] = sum_buckets(parts)
    return pool
