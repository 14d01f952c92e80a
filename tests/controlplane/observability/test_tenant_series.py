"""Per-tenant series of a deployment, from its gateways' real per-tenant metrics (the gateway's own collectors): each
scrape keeps a ring per tenant, and stores requests, tokens, errors, TTFT and queue-wait quantiles and the share of
each per-minute limit used, pooled over the deployment's gateways, for the tenants that used it in the window only;
reads give one value per deployment of a tenant, or points over a range; retention prunes them with raw samples."""
from __future__ import annotations

import hashlib

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from controlplane.observability import store
from controlplane.observability.exposition import parse_exposition
from controlplane.observability.models import TenantSample
from controlplane.observability.rollup import prune
from controlplane.observability.scraper import Fetched
from controlplane.observability.store import scrape_cycle
from controlplane.observability.tenant_rates import tenant_increments, tenant_states, tenant_values
from controlplane.observability.tenant_series import tenant_metric_values, tenant_series_range
from inference.gateway.admission import Admission
from inference.gateway.tenancy import TenantGate
from inference.gateway.tenant_policy import parse_tenancy
from inference.metrics import TandemMetrics

T0 = 1_800_000_000.0


class Gateway:
    """One gateway's tenant gate and admission queue with its /metrics, without its HTTP server: requests are
    admitted, served and released through the same objects the gateway's handlers use."""

    def __init__(self, limits: dict) -> None:
        def tenant(name: str) -> dict:
            return {"class": "standard", "limits": limits.get(name, {}), "allowed": True,
                    "keys": [{"hash": hashlib.sha256(name.encode()).hexdigest(), "expires_at": None}]}

        policy = parse_tenancy({"requires_key": True, "tenants": {name: tenant(name) for name in ("acme", "beta")}})
        self.gate = TenantGate(lambda: policy)
        self.gate.sync()
        self.admission = Admission(lambda: 64)
        self.metrics = TandemMetrics(role="gateway", model="tiny", registry=CollectorRegistry(), gpu=False)
        self.metrics.registry.register(self.gate.collector("tiny"))
        self.metrics.registry.register(self.admission.collector("tiny"))

    def serve(self, tenant: str, *, prompt: int, completion: int, ttft_s: float, wait_s: float = 0.0,
              fail: bool = False) -> None:
        state = self.gate.states[tenant]
        ticket = self.gate.admit(state, {}, {"prompt": "x" * (4 * prompt), "max_tokens": completion})
        ticket.slot = self.admission._admit(tenant, "standard", wait_s)
        ticket.observe_ttft(ttft_s)

        class Stream:  # what Ticket.release reads of a finished stream
            prompt_tokens = prompt
            token_ids = [0] * completion
            finish = None if fail else type("Finish", (), {"completion_tokens": completion})()

        ticket.stream = Stream()
        ticket.release()

    def page(self) -> str:
        return generate_latest(self.metrics.registry).decode()


def test_a_tenants_rates_quantiles_and_quota_ratio_come_from_its_own_series():
    gateway = Gateway({"acme": {"tokens_per_minute": 6000, "requests_per_minute": 120}})
    rings = tenant_states(None, parse_exposition(gateway.page()), T0, 30)
    for _ in range(9):
        gateway.serve("acme", prompt=100, completion=50, ttft_s=0.04, wait_s=0.0)
    gateway.serve("acme", prompt=100, completion=0, ttft_s=3.0, wait_s=4.0, fail=True)
    reading = parse_exposition(gateway.page())
    assert reading.tenant_limits == {"acme": {"requests_per_minute": 120.0, "tokens_per_minute": 6000.0}}
    rings = tenant_states(rings, reading, T0 + 10, 30)
    assert set(rings) == {"acme", "beta"}
    values = tenant_values([(tenant_increments(rings["acme"]), reading.tenant_limits["acme"])])
    assert values["qps"] == pytest.approx(1.0)
    assert values["error_ratio"] == pytest.approx(0.1)
    assert values["prompt_tokens_per_second"] == pytest.approx(100.0)
    assert values["generation_tokens_per_second"] == pytest.approx(45.0)
    assert values["ttft_p50_seconds"] <= 0.05 < 2.5 < values["ttft_p99_seconds"] <= 5.0
    assert values["queue_wait_p50_seconds"] <= 0.005 and 2.5 < values["queue_wait_p99_seconds"] <= 5.0
    # 1,450 tokens in 10 s is 8,700 a minute against 6,000; 10 requests in 10 s is 60 a minute against 120.
    assert values["tokens_per_minute_quota_ratio"] == pytest.approx(8700 / 6000)
    assert values["requests_per_minute_quota_ratio"] == pytest.approx(0.5)
    # beta sent nothing: no values, not zeros.
    assert tenant_values([(tenant_increments(rings["beta"]), {})]) == {}


@pytest.fixture
def pages(monkeypatch):
    answers: dict[int, str] = {}

    def scrape(targets, **_):
        return [Fetched(t, parse_exposition(answers[t.worker_id]), "", 0.0) for t in targets if t.worker_id in answers]

    monkeypatch.setattr(store, "scrape", scrape)
    return answers


def test_the_scrape_stores_each_active_tenant_pooled_over_the_deployments_gateways(deployment, make_worker,
                                                                                   pages, settings):
    gateways = [Gateway({"acme": {"tokens_per_minute": 600}}), Gateway({"acme": {"tokens_per_minute": 3000}})]
    workers = [make_worker(deployment, "gateway", port=port) for port in (1, 2)]
    for gateway, worker in zip(gateways, workers):
        pages[worker.pk] = gateway.page()
    scrape_cycle(now=T0)
    assert not TenantSample.objects.exists()  # one snapshot: no rate yet
    gateways[0].serve("acme", prompt=40, completion=10, ttft_s=0.2)
    for _ in range(3):
        gateways[1].serve("acme", prompt=40, completion=10, ttft_s=0.2)
    for gateway, worker in zip(gateways, workers):
        pages[worker.pk] = gateway.page()
    scrape_cycle(now=T0 + 5)
    stored = {(s.tenant, s.metric) for s in TenantSample.objects.all()}
    assert stored and {tenant for tenant, _ in stored} == {"acme"}  # beta was idle: no rows
    qps = tenant_metric_values(metric="qps", tenant="acme", now=T0 + 5, window_s=10)
    assert [(v.deployment_id, v.deployment_name, v.role) for v in qps] == [(deployment.pk, deployment.name,
                                                                            "gateway")]
    assert qps[0].value == pytest.approx(4 / 5)  # both gateways' requests together
    # The first gateway ran at 50 tokens in 5 s = 600 a minute, all of its limit; the second at 30 % of its own.
    (ratio,) = tenant_metric_values(metric="tokens_per_minute_quota_ratio", tenant="acme", now=T0 + 5)
    assert ratio.value == pytest.approx(1.0)
    assert tenant_metric_values(metric="qps", tenant="beta", now=T0 + 5) == []
    with pytest.raises(ValueError, match="not stored per tenant"):
        tenant_metric_values(metric="kv_cache_usage_ratio", tenant="acme", now=T0 + 5)
    series = tenant_series_range(tenant="acme", metrics=["qps", "ttft_p99_seconds"], start=T0 - 60, end=T0 + 60,
                                 step=10)
    assert [item["deployment_id"] for item in series["qps"]] == [deployment.pk]
    assert series["qps"][0]["points"] == [[T0, pytest.approx(0.8)]]
    assert 0.1 < series["ttft_p99_seconds"][0]["points"][0][1] <= 0.25
    assert prune(now=T0 + settings.TANDEM_METRICS_RAW_RETENTION_S + 10)["tenant_samples"] == len(stored)
