"""A gateway's request metrics labelled by revision are stored per revision (observability.RevisionSample) by the scrape
cycle, each revision's rates and quantiles from its own counters; the gateway's own series stay as they were."""
from __future__ import annotations

from controlplane.models import WorkerRole
from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import RevisionSample, Sample
from controlplane.observability.store import scrape_cycle
from tests.controlplane.rollouts.conftest import FakeGatewayMetrics

T0 = 1_800_000_000.0


def _value(revision: int, metric: str) -> float | None:
    rows = RevisionSample.objects.filter(revision=revision, metric=METRIC_IDS[metric], ts=T0 + 10)
    values = list(rows.values_list("value", flat=True))
    assert len(values) <= 1
    return values[0] if values else None


def test_each_revision_the_gateway_served_gets_its_own_series(deployment, make_worker):
    server = FakeGatewayMetrics()
    try:
        gateway = make_worker(deployment, WorkerRole.GATEWAY, port=server.port)
        server.revisions = {1: {"ok": 100, "ttft": 0.03}, 2: {"ok": 10, "ttft": 0.03}}
        scrape_cycle(now=T0)
        assert not RevisionSample.objects.exists()  # one scrape: no rate yet
        server.revisions = {1: {"ok": 150, "ttft": 0.03}, 2: {"ok": 10, "errors": 10, "ttft": 0.8}}
        scrape_cycle(now=T0 + 10)
    finally:
        server.close()
    assert _value(1, "qps") == 5.0 and _value(2, "qps") == 1.0
    assert _value(1, "error_ratio") == 0.0 and _value(2, "error_ratio") == 1.0
    assert _value(1, "ttft_p99_seconds") <= 0.05 < 0.5 < _value(2, "ttft_p99_seconds")
    assert set(RevisionSample.objects.values_list("deployment_id", flat=True)) == {deployment.pk}
    # The gateway's own series (all revisions together) are stored as before.
    total = Sample.objects.get(worker_id=gateway.pk, metric=METRIC_IDS["qps"], ts=T0 + 10).value
    assert total == 6.0
