"""The gateway's per-tenant series on /metrics, read from its TenantGate's states at scrape time: requests, tokens,
errors, 429s by limit, requests running, time to first token (a histogram) and the limits it enforces (the metered
ones of tenant_limits.py: a cap on one request is no flow to run close to).

The `tenant` label takes only the tenants the membership names (a tenant gone from it leaves with its series), at
most the control plane's TANDEM_MAX_TENANTS (100 by default): ~50 series each with admission's, the TTFT histogram's
18 here the most.
"""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from inference.gateway.tenant_limits import METERED


class Histogram:
    """Cumulative bucket counts, their sum and count: one tenant's time to first token, for /metrics. Plain numbers
    read at scrape time rather than a prometheus_client Histogram, whose labelled children would outlive a tenant
    that left the membership."""

    __slots__ = ("bounds", "buckets", "total", "count")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * len(bounds)
        self.total = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        self.total += seconds
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if seconds <= bound:
                self.buckets[i] += 1

    def exposition(self) -> list[tuple[str, float]]:
        return [*((str(b), n) for b, n in zip(self.bounds, self.buckets)), ("+Inf", self.count)]


class TenantCollector(Collector):
    """The series of every tenant of `gate` (a tenancy.TenantGate), read at scrape time."""

    def __init__(self, gate, model: str) -> None:
        self.gate, self.model = gate, model

    def collect(self):
        base = ["role", "model", "tenant"]
        requests = CounterMetricFamily("tandem_gateway_tenant_requests", "Requests admitted, by tenant.",
                                       labels=base)
        tokens = CounterMetricFamily("tandem_gateway_tenant_tokens", "Prompt and completion tokens of the tenant's "
                                     "requests (what its tokens_per_minute counts).", labels=[*base, "kind"])
        errors = CounterMetricFamily("tandem_gateway_tenant_errors", "Admitted requests that did not finish.",
                                     labels=base)
        limited = CounterMetricFamily("tandem_gateway_tenant_rate_limited", "Requests refused with 429, by the "
                                      "limit they were over.", labels=[*base, "limit"])
        running = GaugeMetricFamily("tandem_gateway_tenant_requests_running", "The tenant's requests in flight.",
                                    labels=base)
        ttft = HistogramMetricFamily("tandem_gateway_tenant_time_to_first_token_seconds", "Time to first token of "
                                     "the tenant's requests, as its clients see it.", labels=base)
        limits = GaugeMetricFamily("tandem_gateway_tenant_limit", "The limits this gateway enforces on the tenant "
                                   "(absent: no limit).", labels=[*base, "limit"])
        for name, state in sorted(self.gate.states.items()):
            labels = ["gateway", self.model, name]
            requests.add_metric(labels, state.num_requests)
            tokens.add_metric([*labels, "prompt"], state.num_prompt_tokens)
            tokens.add_metric([*labels, "completion"], state.num_completion_tokens)
            errors.add_metric(labels, state.num_errors)
            for limit in METERED:
                limited.add_metric([*labels, limit], state.num_limited.get(limit, 0))
            running.add_metric(labels, state.num_running)
            ttft.add_metric(labels, state.ttft.exposition(), state.ttft.total)
            for limit in METERED:
                if state.policy.limits.get(limit) is not None:
                    limits.add_metric([*labels, limit], state.policy.limits[limit])
        yield from (requests, tokens, errors, limited, running, ttft, limits)
