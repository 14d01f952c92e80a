"""Usage you can bill, from the gateways' per-tenant counters: each scrape adds what the counters grew by to the
hour's row of (tenant, deployment); a gateway restarted in place (its counters back at 0) neither double counts nor
loses what was stored; a gateway seen for the first time counts from 0 only when it has just started."""
from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from controlplane.observability import store
from controlplane.observability.exposition import parse_exposition
from controlplane.observability.scraper import Fetched
from controlplane.observability.store import scrape_cycle
from controlplane.tenants.models import TenantUsage
from controlplane.tenants.usage import add_usage, counter_deltas, hour_of, prune_usage, usage_rows
from inference.gateway.tenancy import TenantGate
from inference.gateway.tenant_policy import parse_tenancy
from inference.metrics import TandemMetrics

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z, the start of an hour
STARTED = T0 - 100.0


def counters(requests=0, prompt=0, completion=0, errors=0, limited=0, shed=0) -> dict:
    return {"requests": requests, "prompt_tokens": prompt, "completion_tokens": completion, "errors": errors,
            "rate_limited": limited, "shed": shed}


def page(tenants: dict[str, dict], started_at: float = STARTED) -> str:
    """A gateway's /metrics as its collectors write it (the series the scrape reads)."""
    lines = [f"process_start_time_seconds {started_at}", 'tandem_request_success_total{role="gateway"} 0']
    for name, c in tenants.items():
        labels = f'role="gateway",model="tiny",tenant="{name}"'
        lines += [f"tandem_gateway_tenant_requests_total{{{labels}}} {c['requests']}",
                  f'tandem_gateway_tenant_tokens_total{{{labels},kind="prompt"}} {c["prompt_tokens"]}',
                  f'tandem_gateway_tenant_tokens_total{{{labels},kind="completion"}} {c["completion_tokens"]}',
                  f"tandem_gateway_tenant_errors_total{{{labels}}} {c['errors']}",
                  f'tandem_gateway_tenant_rate_limited_total{{{labels},limit="requests_per_minute"}} '
                  f'{c["rate_limited"]}',
                  f'tandem_gateway_tenant_rate_limited_total{{{labels},limit="tokens_per_minute"}} 0',
                  f'tandem_gateway_queue_shed_total{{role="gateway",model="tiny",class="standard",tenant="{name}",'
                  f'reason="queue_full"}} {c["shed"]}']
    return "\n".join(lines) + "\n"


def test_the_gateways_own_collector_is_read_per_tenant():
    policy = parse_tenancy({"requires_key": True, "tenants": {"acme": {
        "class": "standard", "limits": {}, "allowed": True,
        "keys": [{"hash": hashlib.sha256(b"tk-a").hexdigest(), "expires_at": None}]}}})
    gate = TenantGate(lambda: policy)
    gate.sync()
    state = gate.states["acme"]
    state.num_requests, state.num_prompt_tokens, state.num_completion_tokens = 3, 120, 45
    state.num_errors, state.num_limited = 1, {"requests_per_minute": 2, "tokens_per_minute": 5}
    metrics = TandemMetrics(role="gateway", model="tiny", registry=CollectorRegistry(), gpu=False)
    metrics.registry.register(gate.collector("tiny"))  # as the gateway registers it
    reading = parse_exposition(generate_latest(metrics.registry).decode())
    assert reading.by_tenant == {"acme": {"requests": 3, "prompt_tokens": 120, "completion_tokens": 45,
                                          "errors": 1, "rate_limited": 7}}
    assert 0 < reading.started_at <= time.time()  # what tells a restart


def test_counters_growth_restart_and_first_sight():
    state, growth = counter_deltas(None, {"acme": counters(2, 100, 50)}, STARTED, T0)
    assert growth == {"acme": counters(2, 100, 50)}  # a gateway that just started: all of it is new usage
    state, growth = counter_deltas(state, {"acme": counters(5, 300, 80), "beta": counters(1, 10)}, STARTED, T0 + 5)
    assert growth == {"acme": counters(3, 200, 30), "beta": counters(1, 10)}
    _, growth = counter_deltas(state, {"acme": counters(5, 300, 80), "beta": counters(1, 10)}, STARTED, T0 + 10)
    assert growth == {}  # nothing new: nothing to write
    # Restarted (new start time): the counters began at 0 again, so the whole value is new, even where it exceeds
    # the last reading.
    state2, growth = counter_deltas(state, {"acme": counters(7, 400, 90)}, T0 + 8, T0 + 10)
    assert growth == {"acme": counters(7, 400, 90)}
    # Without a start time, a counter below its last reading says the same (for that tenant only).
    _, growth = counter_deltas({"start": None, "c": state["c"]},
                               {"acme": counters(1, 20, 5), "beta": counters(2, 15)}, None, T0 + 10)
    assert growth == {"acme": counters(1, 20, 5), "beta": counters(1, 5)}
    # First seen long after it started (its state was pruned, or usage was not kept then): a baseline only.
    state3, growth = counter_deltas(None, {"acme": counters(900, 9000)}, T0 - 86400, T0)
    assert growth == {} and state3["c"]["acme"]["requests"] == 900


@pytest.fixture
def gateway(deployment, make_worker):
    return make_worker(deployment, "gateway", port=1)


@pytest.fixture
def pages(monkeypatch):
    """What the gateway answers at each cycle: set pages[worker_id]; None: it does not answer."""
    answers: dict[int, str | None] = {}

    def scrape(targets, **_):
        return [Fetched(t, parse_exposition(answers[t.worker_id]), "", 0.0) if answers.get(t.worker_id)
                else Fetched(t, None, "ConnectionRefused", 0.0) for t in targets]

    monkeypatch.setattr(store, "scrape", scrape)
    return answers


def usage(**filters) -> dict:
    return {(r.tenant, r.hour.hour): (r.requests, r.prompt_tokens, r.completion_tokens, r.rate_limited, r.shed)
            for r in TenantUsage.objects.filter(**filters)}


def test_a_gateway_restart_neither_double_counts_nor_loses_the_stored_counts(deployment, gateway, pages):
    pages[gateway.pk] = page({"acme": counters(2, 100, 40, limited=1)})
    scrape_cycle(now=T0 + 1)
    pages[gateway.pk] = page({"acme": counters(5, 250, 90, limited=1, shed=2)})
    scrape_cycle(now=T0 + 6)
    assert usage() == {("acme", 8): (5, 250, 90, 1, 2)}
    pages[gateway.pk] = None  # down for a scrape: nothing added, its last counters kept
    scrape_cycle(now=T0 + 11)
    # Restarted in place, in the next hour: counters from 0 (a new start time), 3 requests since.
    pages[gateway.pk] = page({"acme": counters(3, 30, 9)}, started_at=T0 + 3590)
    scrape_cycle(now=T0 + 3601)
    pages[gateway.pk] = page({"acme": counters(4, 40, 12)}, started_at=T0 + 3590)
    scrape_cycle(now=T0 + 3606)
    assert usage() == {("acme", 8): (5, 250, 90, 1, 2), ("acme", 9): (4, 40, 12, 0, 0)}
    assert TenantUsage.objects.get(hour__hour=8).deployment_id == deployment.pk


def test_two_gateways_of_a_deployment_add_up_in_one_row(deployment, gateway, make_worker, pages):
    other = make_worker(deployment, "gateway", port=2)
    for worker, n in ((gateway, 2), (other, 3)):
        pages[worker.pk] = page({"acme": counters(n, 10 * n)}, started_at=T0)
    scrape_cycle(now=T0 + 5)
    assert usage() == {("acme", 8): (5, 50, 0, 0, 0)}


def test_add_usage_increments_and_prune_drops_old_hours(deployment, settings):
    add_usage(usage_rows(T0 + 10, deployment.pk, {"acme": counters(1, 10, 5)}))
    add_usage(usage_rows(T0 + 20, deployment.pk, {"acme": counters(2, 20, 5)}))
    row = TenantUsage.objects.get()
    assert (row.hour, row.requests, row.prompt_tokens, row.completion_tokens) == (hour_of(T0), 3, 30, 10)
    assert row.hour == datetime(2027, 1, 15, 8, tzinfo=timezone.utc)
    settings.TANDEM_TENANT_USAGE_RETENTION_S = 86400
    assert prune_usage(now=T0 + 86400) == 0  # the hour is still within the day
    assert prune_usage(now=T0 + 86400 + 3600) == 1
