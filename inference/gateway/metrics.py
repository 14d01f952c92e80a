"""The gateway's series: the shared tandem_* set with role="gateway" (what the client sees, by `revision`), plus
routing state.

Each deployment a gateway serves has its series in a registry of its own, labelled with its `model`; a shared
gateway's page merges them (`render`), since a Prometheus exposition names each family once."""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from inference.metrics import BASE_LABELS, TandemMetrics
from inference.gateway.routing import Router


class RouterCollector(Collector):
    """Per-worker health, load and weight, read from the router at scrape time (nothing to keep in sync)."""

    def __init__(self, router: Router, model: str) -> None:
        self.router = router
        self.model = model

    def collect(self):
        labels = ["role", "model", "worker", "stage"]
        up = GaugeMetricFamily("tandem_gateway_worker_up", "1 while the worker is in rotation.", labels=labels)
        outstanding = GaugeMetricFamily("tandem_gateway_worker_outstanding_requests",
                                        "Requests the gateway has in flight on the worker.", labels=labels)
        weight = GaugeMetricFamily("tandem_gateway_worker_weight",
                                   "The worker's routing weight: it is picked by least (outstanding + 1) / weight.",
                                   labels=labels)
        for worker in self.router.workers:
            values = ["gateway", self.model, worker.url, worker.role.value]
            up.add_metric(values, 1.0 if worker.is_ready else 0.0)
            outstanding.add_metric(values, float(worker.num_outstanding))
            weight.add_metric(values, float(worker.weight))
        yield up
        yield outstanding
        yield weight
        # Prefix affinity: requests sent to their key's home worker, or spilled past it because it was loaded above
        # the bound (a stage without prefix caching, or a request without a key, is picked by load and counted in
        # neither).
        decisions = CounterMetricFamily("tandem_gateway_prefix_routing",
                                        "Requests routed by prefix affinity, by stage and decision (affinity: the "
                                        "key's home worker; spilled: a later one, the home being over the load bound).",
                                        labels=["role", "model", "stage", "decision"])
        for stage in ("prefill", "colocated"):
            for decision in ("affinity", "spilled"):
                decisions.add_metric(["gateway", self.model, stage, decision],
                                     float(self.router.affinity_decisions.get((stage, decision), 0)))
        yield decisions


class GatewayMetrics(TandemMetrics):
    def __init__(self, *, model: str, router: Router, process: bool = True) -> None:
        # Per-request series by the revision that served ("" for the static group and for requests refused before a
        # group was picked), so that a canary and its stable revision are compared over the same window. `process`:
        # the process's CPU and memory series too (a shared gateway's deployments leave them to the gateway's own).
        super().__init__(role="gateway", model=model, gpu=False, process=process, request_labels=("revision",))
        self._retries = Counter("tandem_gateway_retries", "Requests whose first try failed before the first token "
                                "and were retried on another worker (when one was ready), by what failed.",
                                (*BASE_LABELS, "kind"), registry=self.registry)
        self._migrations = Counter("tandem_request_migrations", "Requests moved to another worker pair mid-stream "
                                   "because their worker went away, by what broke the stream.",
                                   (*BASE_LABELS, "reason"), registry=self.registry)
        self.registry.register(RouterCollector(router, model))

    def count_retry(self, kind: str) -> None:
        self._retries.labels(role=self.role, model=self.model, kind=kind).inc()

    def count_migration(self, reason: str) -> None:
        self._migrations.labels(role=self.role, model=self.model, reason=reason).inc()


class _Merged(Collector):
    def __init__(self, registries: Iterable[CollectorRegistry]) -> None:
        self.registries = list(registries)

    def collect(self):
        families: dict[str, Metric] = {}
        for registry in self.registries:
            for family in registry.collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type,
                                                            family.unit)
                merged.samples.extend(family.samples)
        yield from families.values()


def render(registries: Iterable[CollectorRegistry]) -> bytes:
    """One exposition of several registries' series: each family once, with the samples of all (their `model` labels
    tell the deployments apart)."""
    return generate_latest(_Merged(registries))
