"""From a worker's or gateway's Prometheus text to the raw numbers the scraper keeps. No Django.

Only the families Tandem stores are parsed: the text is first cut down to their lines (a cheap prefix test). Cutting
saves prometheus_client's parser most of its work, and the regular expression fast path (see _samples) is several times
faster still, which is what lets one control process scrape 1,000 targets within a cycle on two cores (the figures:
docs/performance.md, 'Control plane at scale'). prometheus_client's parser remains the reference (tests compare both)
and the fallback.
Error classes (the gateway counts failed requests by `kind`, not by HTTP status, see inference/gateway/app.py):
the kinds that answer a 4xx (bad input, unknown model, body too large, 429 back-pressure) or that the client
caused (disconnect) are *client* errors; every other kind (timeout 504, no_ready_workers 503, upstream/KV-transfer
failures 502, engine and internal errors) is a *server* error and counts toward `server_error_ratio` (the "5xx
ratio"). `error_ratio` counts both. `worker_rejected` is the gateway passing on a worker's 429 (admission queue full)
or 503 (draining): back-pressure, not a failure of the service, so it is a client-class error here.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from controlplane.observability.catalog import STORED_HISTOGRAMS, TENANT_HISTOGRAMS

CLIENT_ERROR_KINDS = frozenset({
    "invalid_json", "invalid_type", "invalid_value", "missing_required_parameter", "unsupported_value",
    "invalid_request", "model_not_found", "request_too_large", "not_found", "overloaded", "worker_rejected",
    "client_disconnected", "bad_request", "validation", "queue_full",
    # A caller's key missing or wrong, its tenant over a limit, a prompt or max_tokens past what it may ask:
    # the caller's mistake, never the deployment's failure (docs/chaos.md).
    "missing_api_key", "invalid_api_key", "rate_limit_exceeded", "max_tokens_exceeded", "context_length_exceeded",
    "too_many_wrong_keys",
})

_HISTOGRAM_BUCKETS = {name + "_bucket": key for key, name in STORED_HISTOGRAMS.items()}
# Counter samples → key in Reading.counters.
_COUNTERS = {
    "tandem_prompt_tokens_total": "prompt_tokens",
    "tandem_generation_tokens_total": "generation_tokens",
    "tandem_request_success_total": "success",
    "process_cpu_seconds_total": "cpu_seconds",
    # The histogram of tokens fed per engine step: only its sum and count are kept (the mean per step).
    "tandem_batch_tokens_per_step_sum": "batch_tokens",
    "tandem_batch_tokens_per_step_count": "batch_steps",
    # Prefix caching: prompt tokens looked up at admission, and those found cached.
    "tandem_prefix_cache_queried_tokens_total": "prefix_queried_tokens",
    "tandem_prefix_cache_hit_tokens_total": "prefix_hit_tokens",
    # Speculative decoding: draft tokens verified and accepted (workers; 0 without speculation).
    "tandem_spec_decode_proposed_tokens_total": "spec_proposed",
    "tandem_spec_decode_accepted_tokens_total": "spec_accepted",
    # A gateway's requests moved mid-stream to another worker pair, and retried before their first token (summed over
    # their reason and kind): what a chaos run's report counts.
    "tandem_request_migrations_total": "migrations",
    "tandem_gateway_retries_total": "retries",
}
# Gauges → (key, how several label sets combine: GPUs of one worker).
_GAUGES = {
    "tandem_requests_running": ("requests_running", "sum"),
    "tandem_requests_waiting": ("requests_waiting", "sum"),
    "tandem_kv_cache_usage_ratio": ("kv_cache_usage_ratio", "max"),
    "tandem_gpu_utilization_ratio": ("gpu_utilization_ratio", "max"),
    "tandem_gpu_memory_used_bytes": ("gpu_memory_used_bytes", "sum"),
    "tandem_gpu_memory_total_bytes": ("gpu_memory_total_bytes", "sum"),
    "tandem_gpu_temperature_celsius": ("gpu_temperature_celsius", "max"),
    "tandem_gpu_power_watts": ("gpu_power_watts", "sum"),
    "tandem_gpu_memory_fragmentation_bytes": ("gpu_memory_fragmentation_bytes", "sum"),
    "process_resident_memory_bytes": ("resident_memory_bytes", "sum"),
    "tandem_gateway_queue_length": ("queue_length", "sum"),  # summed over the classes and tenants
    "tandem_prefill_roofline_ratio": ("prefill_roofline_ratio", "max"),
    "tandem_decode_roofline_ratio": ("decode_roofline_ratio", "max"),
}
_ERRORS = "tandem_request_errors_total"
# A gateway's per-tenant counters → key in Reading.by_tenant[tenant] (what the tenants app bills, see
# controlplane/tenants/usage.py); rate-limited requests are summed over their `limit`, shed ones over `reason`.
_TENANT_COUNTERS = {
    "tandem_gateway_tenant_requests_total": "requests",
    "tandem_gateway_tenant_errors_total": "errors",
    "tandem_gateway_tenant_rate_limited_total": "rate_limited",
    "tandem_gateway_queue_shed_total": "shed",
}
_TENANT_TOKENS = "tandem_gateway_tenant_tokens_total"  # kind="prompt" | "completion"
# A gateway's histograms split by their `tenant` label (summed over the others: the queue wait's class) → key in
# Reading.tenant_histograms[tenant]; and the limits it enforces per tenant (tenant_limits).
_TENANT_BUCKETS = {name + "_bucket": key for key, name in TENANT_HISTOGRAMS.items()}
_TENANT_LIMIT = "tandem_gateway_tenant_limit"
_START_TIME = "process_start_time_seconds"
_WANTED = tuple(sorted({*STORED_HISTOGRAMS.values(), *(n.removesuffix("_total") for n in _COUNTERS), *_GAUGES,
                        _ERRORS.removesuffix("_total"), *(n.removesuffix("_total") for n in _TENANT_COUNTERS),
                        _TENANT_TOKENS.removesuffix("_total"), *TENANT_HISTOGRAMS.values(), _TENANT_LIMIT,
                        _START_TIME}))

# One sample line without escapes: name{label="value",...} value [timestamp]
_LINE = re.compile(r'([a-zA-Z_:][a-zA-Z0-9_:]*)'                           # name
                   r'(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="[^"]*",?)*)\})?'     # {label="value",...}
                   r'[ \t]+(\S+)(?:[ \t]+\S+)?[ \t]*')                      # value [timestamp]
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


@dataclass(slots=True)
class Reading:
    """One scrape of one target: cumulative counters, cumulative histogram buckets and current gauges."""

    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    # The same counters and histograms split by a `revision` label (the gateway labels its request metrics with
    # the revision that served): what canary analysis compares. Empty for a target without the label.
    by_revision: dict[str, "Reading"] = field(default_factory=dict)
    # A gateway's cumulative per-tenant counters (requests, prompt_tokens, completion_tokens, errors, rate_limited,
    # shed) by the `tenant` label, and its process's start time (Unix seconds; None when not exposed).
    by_tenant: dict[str, dict[str, float]] = field(default_factory=dict)
    started_at: float | None = None
    # A gateway's per-tenant histograms (TENANT_HISTOGRAMS keys: ttft, queue_wait), cumulative (le, count) pairs,
    # and the limits it enforces per tenant ({tenant: {"tokens_per_minute": 6000.0, ...}}).
    tenant_histograms: dict[str, dict[str, list[tuple[float, float]]]] = field(default_factory=dict)
    tenant_limits: dict[str, dict[str, float]] = field(default_factory=dict)


def _relevant_lines(text: str) -> list[str]:
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            # Keep TYPE lines of wanted families (the parser needs them to group _bucket samples); drop HELP.
            if line.startswith("# TYPE ") and line[7:].startswith(_WANTED):
                kept.append(line)
        elif line.startswith(_WANTED):
            kept.append(line)
    return kept


def model_page(text: str, model: str) -> str:
    """The part of a shared gateway's page that is one deployment's: the samples labelled with its `model`, and the
    process's start time (how a restart is told apart from a counter's growth). The process's other series (CPU,
    memory) have no `model`: they belong to no deployment, and would be counted once per deployment if kept.
    Raises ValueError when no sample names the model (a deployment the process does not serve yet)."""
    label = re.compile(r'[{,]model="' + re.escape(model) + r'"[,}]')
    kept, num_own = [], 0
    for line in text.splitlines():
        if line.startswith("#") or line.startswith(_START_TIME):
            kept.append(line)
        elif label.search(line):
            kept.append(line)
            num_own += 1
    if num_own == 0:
        raise ValueError(f"the shared gateway's page has no series of the model {model!r}")
    return "\n".join(kept) + "\n"


def _samples(text: str):
    """(name, labels, value) of the wanted samples. `labels` may be shared between calls: read it, never change it.

    Lines without a backslash (every line Tandem's processes write: labels are role, model, gpu, le, kind,
    finished_reason) take the fast path. A line is its series (`name{labels}`) and its value; the series of one
    model's processes are the same lines scrape after scrape and target after target (no label names the worker), so
    what a series means (its name and labels, or not wanted) is worked out once, by one compiled regular expression,
    and kept in _SERIES; after that a line costs a split and a lookup. prometheus_client's character-by-character
    parser, many times slower, would not keep a 1,000-target cycle within its interval. Text with any escape sequence
    goes to that parser, which handles the whole grammar. Either way a malformed wanted line raises ValueError.
    """
    if "\\" in text:
        for family in text_string_to_metric_families("\n".join(_relevant_lines(text)) + "\n"):
            for sample in family.samples:
                yield sample.name, sample.labels, sample.value
        return
    known = _SERIES
    if len(known) > MAX_KNOWN_SERIES:  # foreign pages with timestamps or ever-new labels: start again
        known.clear()
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        series, _, value = line.rpartition(" ")
        meaning = known.get(series, _UNKNOWN)
        if meaning is _UNKNOWN:
            meaning, value = _meaning(line, series, value)
        if meaning is not None:
            yield meaning[0], meaning[1], float(value)


_UNKNOWN = object()
# What each series line seen so far means: (name, labels) of a wanted one, None for one not stored.
_SERIES: dict[str, tuple[str, dict[str, str]] | None] = {}
MAX_KNOWN_SERIES = 100_000


def _meaning(line: str, series: str, last: str) -> tuple[tuple[str, dict[str, str]] | None, str]:
    """A line whose series is not in _SERIES: what it means and its value (ValueError for a malformed wanted line).
    Kept in _SERIES only where the line is exactly `series value` (no timestamp), as the fast path splits it."""
    if not line.startswith(_WANTED):
        if series:  # a line without a space has no series of its own to remember
            _SERIES[series] = None
        return None, last
    match = _LINE.fullmatch(line)
    if match is None:
        raise ValueError(f"not a Prometheus sample line: {line[:200]!r}")
    name, labels, value = match.groups()
    meaning = (name, dict(_LABEL.findall(labels)) if labels else {})
    if value == last:
        _SERIES[series] = meaning
    return meaning, value


def parse_exposition(text: str) -> Reading:
    """Raises ValueError on text that is not Prometheus exposition."""
    reading = Reading()
    counters, gauges = reading.counters, reading.gauges
    # Labelled counters have no sample until their first increment: absent means 0 for them.
    counters.update(success=0.0, errors=0.0, server_errors=0.0)
    buckets: dict[str, dict[float, float]] = {}
    per_revision: dict[str, tuple[Reading, dict[str, dict[float, float]]]] = {}
    per_tenant: dict[str, dict[str, dict[float, float]]] = {}
    num_samples = 0
    for name, labels, value in _samples(text):
        num_samples += 1
        if name in _TENANT_BUCKETS and labels.get("tenant"):
            per_le = per_tenant.setdefault(labels["tenant"], {}).setdefault(_TENANT_BUCKETS[name], {})
            le = float(labels["le"])
            per_le[le] = per_le.get(le, 0.0) + value
            if name not in _HISTOGRAM_BUCKETS:
                continue
        revision = labels.get("revision")
        if revision is not None and (name in _HISTOGRAM_BUCKETS or name in _COUNTERS or name == _ERRORS):
            part = per_revision.get(revision)
            if part is None:
                part = per_revision[revision] = (Reading(counters={"success": 0.0, "errors": 0.0,
                                                                   "server_errors": 0.0}), {})
            _fold_request_sample(part[0].counters, part[1], name, labels, value)
        if name in _HISTOGRAM_BUCKETS:
            per_le = buckets.setdefault(_HISTOGRAM_BUCKETS[name], {})
            le = float(labels["le"])
            per_le[le] = per_le.get(le, 0.0) + value
        elif name in _COUNTERS:
            key = _COUNTERS[name]
            counters[key] = counters.get(key, 0.0) + value
        elif name == _ERRORS:
            counters["errors"] += value
            if labels.get("kind", "") not in CLIENT_ERROR_KINDS:
                counters["server_errors"] += value
        elif name in _TENANT_COUNTERS or name == _TENANT_TOKENS:
            _fold_tenant_sample(reading.by_tenant, name, labels, value)
        elif name == _START_TIME:
            reading.started_at = value
        elif name == _TENANT_LIMIT and labels.get("tenant") and labels.get("limit") and not math.isnan(value):
            reading.tenant_limits.setdefault(labels["tenant"], {})[labels["limit"]] = value
        elif name in _GAUGES and not math.isnan(value):
            key, combine = _GAUGES[name]
            if key not in gauges:
                gauges[key] = value
            elif combine == "sum":
                gauges[key] += value
            else:
                gauges[key] = max(gauges[key], value)
    if num_samples == 0:
        # A 200 page without a single Tandem series (a proxy's HTML, another service on the port) is not up.
        raise ValueError("no tandem_* or process_* series in the text")
    reading.histograms = {key: sorted(per_le.items()) for key, per_le in buckets.items()}
    for revision, (part, part_buckets) in per_revision.items():
        part.histograms = {key: sorted(per_le.items()) for key, per_le in part_buckets.items()}
        reading.by_revision[revision] = part
    reading.tenant_histograms = {tenant: {key: sorted(per_le.items()) for key, per_le in histograms.items()}
                                 for tenant, histograms in per_tenant.items()}
    return reading


def _fold_tenant_sample(by_tenant: dict, name: str, labels: dict, value: float) -> None:
    tenant = labels.get("tenant")
    if not tenant or math.isnan(value):
        return
    if name == _TENANT_TOKENS:
        kind = labels.get("kind")
        if kind not in ("prompt", "completion"):
            return
        key = f"{kind}_tokens"
    else:
        key = _TENANT_COUNTERS[name]
    counters = by_tenant.setdefault(tenant, {})
    counters[key] = counters.get(key, 0.0) + value


def _fold_request_sample(counters: dict, buckets: dict, name: str, labels: dict, value: float) -> None:
    """Add one request-metric sample (histogram bucket, counter, errors) into a per-revision part."""
    if name in _HISTOGRAM_BUCKETS:
        per_le = buckets.setdefault(_HISTOGRAM_BUCKETS[name], {})
        le = float(labels["le"])
        per_le[le] = per_le.get(le, 0.0) + value
    elif name in _COUNTERS:
        key = _COUNTERS[name]
        counters[key] = counters.get(key, 0.0) + value
    else:
        counters["errors"] += value
        if labels.get("kind", "") not in CLIENT_ERROR_KINDS:
            counters["server_errors"] += value
