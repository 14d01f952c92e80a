"""A gateway's per-tenant series: from its per-tenant counters, histograms and limits (exposition.Reading's
by_tenant, tenant_histograms, tenant_limits) to the values stored per (deployment, tenant) (TenantSample,
catalog.TENANT_METRICS). Pure functions, no Django.

Each tenant gets rings of snapshots in its gateway's scrape state, like a target's own (derive.state_append), so
its rates and quantiles are over the same window as every other series: one for its counters and TTFT histogram
(the gateway's tenant collector writes them together for every tenant of the membership), one for its queue-wait
histogram (admission writes it from the tenant's first admitted request on: in the first ring, its appearance would
start that ring again and lose the window's counts; it starts from zeros at the scrape before). A deployment's
gateways pool as a pool's workers do: counters and buckets are summed before dividing. The quota ratios are the
largest over the gateways, since each gateway enforces a tenant's limits on its own (tenancy.py in the gateway).

A tenant with no request, token or admission in the window gets no values (no row): an idle tenant costs the store
nothing, and a rule reads its silence as no data, never as 0.
"""
from __future__ import annotations

import math

from controlplane.observability.catalog import QUANTILES, TENANT_METRICS
from controlplane.observability.derive import Increments, state_append
from controlplane.observability.exposition import Reading
from controlplane.observability.quantiles import (aligned_bucket_increases, counter_increase, histogram_quantiles,
                                                  sum_buckets)

COUNTERS = ("requests", "errors", "prompt_tokens", "completion_tokens")
MAX_NAME = 63  # a tenant name (tenants.models.Tenant.name); a longer label value is not a tenant


def tenant_states(previous: dict | None, reading: Reading, ts: float, window_s: float) -> dict[str, dict]:
    """Each tenant's rings ({"c": counters and TTFT, "q": queue wait}) after `reading` (the gateway's scrape at
    `ts`); a tenant gone from the page is dropped."""
    previous = previous or {}
    names = {name for name in (*reading.by_tenant, *reading.tenant_histograms) if len(name) <= MAX_NAME}
    states = {}
    for name in names:
        counters = reading.by_tenant.get(name, {})
        histograms = reading.tenant_histograms.get(name, {})
        before = previous.get(name) or {}
        states[name] = {"c": state_append(before.get("c"), Reading(
            counters={key: counters.get(key, 0.0) for key in COUNTERS},
            histograms={key: buckets for key, buckets in histograms.items() if key != "queue_wait"}), ts, window_s)}
        if "queue_wait" in histograms:
            queued = before.get("q")
            if queued is None and before.get("c"):
                # Absent until the tenant's first admission, so all zeros at the scrape before: counted from there.
                zeros = Reading(histograms={"queue_wait": [(le, 0.0) for le, _ in histograms["queue_wait"]]})
                queued = state_append(None, zeros, before["c"]["ring"][-1]["ts"], window_s)
            states[name]["q"] = state_append(queued, Reading(histograms={"queue_wait": histograms["queue_wait"]}),
                                             ts, window_s)
    return states


def tenant_increments(state: dict) -> Increments | None:
    """What the tenant's counters and buckets grew by over its rings; None until one has two snapshots."""
    inc = None
    for ring in (state.get("c"), state.get("q")):
        part = _ring_increments(ring) if ring is not None else None
        if part is None:
            continue
        if inc is None:
            inc = part
        else:
            inc.histograms.update(part.histograms)
    return inc


def _ring_increments(state: dict) -> Increments | None:
    ring = state["ring"]
    if len(ring) < 2 or ring[-1]["ts"] <= ring[0]["ts"]:
        return None
    inc = Increments(span_s=ring[-1]["ts"] - ring[0]["ts"])
    for key in COUNTERS:
        inc.counters[key] = counter_increase([snapshot["c"].get(key, 0.0) for snapshot in ring])
    for key, bounds in state["le"].items():
        les = [math.inf if b == "+Inf" else float(b) for b in bounds]
        history = [snapshot["h"][key] for snapshot in ring if key in snapshot["h"]]
        if len(history) == len(ring) and all(len(counts) == len(les) for counts in history):
            inc.histograms[key] = aligned_bucket_increases(les, history)
    return inc


def _active(inc: Increments) -> bool:
    return any(inc.counters.values()) or any(count for buckets in inc.histograms.values() for _, count in buckets)


def quota_ratios(inc: Increments, limits: dict[str, float]) -> dict[str, float]:
    """The share of each per-minute limit the tenant used at one gateway over the window (1.0: all of it)."""
    per_minute = 60.0 / inc.span_s
    ratios = {}
    if limits.get("tokens_per_minute"):
        tokens = inc.counters.get("prompt_tokens", 0.0) + inc.counters.get("completion_tokens", 0.0)
        ratios["tokens_per_minute_quota_ratio"] = tokens * per_minute / limits["tokens_per_minute"]
    if limits.get("requests_per_minute"):
        ratios["requests_per_minute_quota_ratio"] = (inc.counters.get("requests", 0.0) * per_minute
                                                     / limits["requests_per_minute"])
    return ratios


def tenant_values(parts: list[tuple[Increments, dict[str, float]]]) -> dict[str, float]:
    """The stored values of one tenant of one deployment, from (its increments, its limits) at each gateway."""
    parts = [(inc, limits) for inc, limits in parts if _active(inc)]
    if not parts:
        return {}
    span = sum(inc.span_s for inc, _ in parts) / len(parts)
    counters = {key: sum(inc.counters.get(key, 0.0) for inc, _ in parts) for key in COUNTERS}
    values: dict[str, float | None] = {
        "qps": counters["requests"] / span,
        "error_ratio": counters["errors"] / counters["requests"] if counters["requests"] else None,
        "prompt_tokens_per_second": counters["prompt_tokens"] / span,
        "generation_tokens_per_second": counters["completion_tokens"] / span,
    }
    for key in sorted({key for inc, _ in parts for key in inc.histograms}):
        buckets = sum_buckets([inc.histograms[key] for inc, _ in parts if inc.histograms.get(key)])
        for label, value in zip(QUANTILES, histogram_quantiles(tuple(QUANTILES.values()), buckets)):
            values[f"{key}_{label}_seconds"] = value
    for inc, limits in parts:
        for name, ratio in quota_ratios(inc, limits).items():
            values[name] = max(ratio, values.get(name) or 0.0)
    return {name: value for name, value in values.items() if value is not None and name in TENANT_METRICS}
