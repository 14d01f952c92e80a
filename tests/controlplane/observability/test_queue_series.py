"""The scraper's admission-queue series, from a gateway's real /metrics text: requests waiting now (summed over
classes and tenants) and the quantiles of how long admitted requests waited, from the histogram's buckets summed
over classes and tenants; a rollout's latency analysis does not pick the queue wait up."""
from __future__ import annotations

from controlplane.observability.catalog import METRIC_IDS, UNITS
from controlplane.observability.derive import state_append, target_series
from controlplane.observability.exposition import parse_exposition
from controlplane.rollouts.analysis import LATENCY_METRICS
from inference.gateway.admission import Admission
from inference.gateway.fair_queue import Waiter
from inference.gateway.config import Config
from inference.gateway.metrics import GatewayMetrics
from inference.gateway.routing import Router


class Gateway:
    """A gateway's metrics and admission queue, without its HTTP server."""

    def __init__(self) -> None:
        self.metrics = GatewayMetrics(model="demo",
                                      router=Router(Config(port=0, colocated_urls=["http://127.0.0.1:1"])))
        self.admission = Admission(lambda: 4)
        self.metrics.registry.register(self.admission.collector("demo"))

    def admitted(self, priority_class: str, tenant: str, waited_s: float, num: int = 1) -> None:
        for _ in range(num):
            self.admission._admit(tenant, priority_class, waited_s)

    def queued(self, priority_class: str, tenant: str) -> None:
        self.admission.queue.push(Waiter(tenant, priority_class, enqueued=0.0, deadline=10.0))

    def reading(self):
        return parse_exposition(self.metrics.render().decode())


def test_queue_length_and_wait_quantiles_are_stored_for_the_gateway():
    gateway = Gateway()
    gateway.admitted("standard", "_anonymous", 0.0)
    state = state_append(None, gateway.reading(), 0.0, window_s=60)
    gateway.admitted("interactive", "acme", 0.02, num=50)
    gateway.admitted("batch", "bulk", 4.0, num=50)
    for priority_class, tenant in [("batch", "bulk"), ("batch", "bulk"), ("standard", "_anonymous")]:
        gateway.queued(priority_class, tenant)
    after = gateway.reading()
    values, _ = target_series(state_append(state, after, 30.0, window_s=60), after.gauges)
    assert values["queue_length"] == 3
    assert values["queue_wait_p50_seconds"] <= 0.025  # half the waits in the window were 20 ms
    assert 2.5 < values["queue_wait_p99_seconds"] <= 5.0
    assert {UNITS[f"queue_wait_{q}_seconds"] for q in ("p50", "p90", "p99")} == {"seconds"}
    assert METRIC_IDS["queue_length"] == 60


def test_a_rollouts_latency_analysis_does_not_read_the_queue_wait():
    assert "queue_wait" not in LATENCY_METRICS


def test_a_gateway_with_nothing_queued_reports_zero_not_nothing():
    gateway = Gateway()
    gateway.admitted("standard", "_anonymous", 0.0)
    assert gateway.reading().gauges["queue_length"] == 0
