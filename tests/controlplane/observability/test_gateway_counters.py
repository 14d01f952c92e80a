"""A gateway's cumulative request counters are kept at each scrape it answered (GatewayCounters, one cycle at a
time), and reader().gateway_counters gives a window's scrapes led by the one that opens it: the counters chaos reads
a fault's window from. Requests by outcome (the server's errors apart from the callers'), migrations, retries and
the latency buckets are summed over revisions; a failed scrape and a worker keep no row."""
from __future__ import annotations

import pytest

from controlplane.models import WorkerRole
from controlplane.observability.gateway_counters import LOOKBACK_S
from controlplane.observability.models import GatewayCounters
from controlplane.observability.reader import reader
from controlplane.observability.scraper import Target
from controlplane.observability.store import scrape_cycle
from tests.controlplane.observability.servers import MetricsServers
from tests.controlplane.rollouts.conftest import exposition

T0 = 1_800_000_000.0


class GatewayPage:
    """What a gateway's /metrics shows: `revisions` as tests/controlplane/rollouts' exposition, plus callers' errors,
    migrations and retries; `up` False answers 500."""

    def __init__(self):
        self.revisions: dict[int, dict] = {1: {"ok": 0}}
        self.client_errors = self.migrations = self.retries = 0
        self.up = True

    def render(self) -> tuple[int, bytes]:
        if not self.up:
            return 500, b"down"
        return 200, (exposition(self.revisions)
                     + f'tandem_request_errors_total{{kind="rate_limit_exceeded",revision=""}} {self.client_errors}\n'
                     + f'tandem_request_migrations_total{{reason="worker_gone"}} {self.migrations}\n'
                     + f'tandem_gateway_retries_total{{kind="upstream_error"}} {self.retries}\n'
                     + f'tandem_gateway_retries_total{{kind="timeout"}} {self.retries}\n').encode()


@pytest.fixture
def page():
    servers = MetricsServers()
    gateway = GatewayPage()
    gateway.port = servers.serve(gateway.render)
    yield gateway
    servers.close()


def test_each_scrape_of_a_gateway_keeps_its_counters_summed_over_revisions(deployment, make_worker, page):
    gateway = make_worker(deployment, WorkerRole.GATEWAY, port=page.port)
    make_worker(deployment, "decode", port=page.port)  # a worker's page: no counters kept
    page.revisions = {1: {"ok": 30, "errors": 2, "ttft": 0.03}, 2: {"ok": 10, "ttft": 0.3}}
    page.client_errors, page.migrations, page.retries = 4, 1, 3
    scrape_cycle(now=T0)
    [row] = GatewayCounters.objects.all()
    assert (row.ts, row.deployment_id, row.worker_id) == (T0, deployment.pk, gateway.pk)
    assert row.snapshot["c"] == {"success": 40, "errors": 6, "server_errors": 2, "migrations": 1, "retries": 6}
    assert set(row.snapshot["h"]) == {"ttft", "itl", "e2e"}
    assert row.snapshot["h"]["ttft"][0] == [0.05, 32] and row.snapshot["h"]["ttft"][-1] == ["+Inf", 42]


def test_a_window_reads_its_scrapes_led_by_the_one_that_opens_it(deployment, make_worker, page):
    gateway = make_worker(deployment, WorkerRole.GATEWAY, port=page.port)
    target = Target(gateway.pk, deployment.pk, WorkerRole.GATEWAY, gateway.url)
    for step, ts in enumerate((T0, T0 + 5, T0 + 10)):
        page.revisions = {1: {"ok": 10 * step}}
        scrape_cycle(now=ts)
    page.up = False
    scrape_cycle(now=T0 + 15)  # no answer: no row

    def read(start: float, end: float) -> list[tuple[float, float]]:
        return [(s["ts"], s["snapshot"]["c"]["success"])
                for s in reader().gateway_counters(target, start=start, end=end)]

    assert read(T0 + 6, T0 + 20) == [(T0 + 5, 10), (T0 + 10, 20)]
    assert read(T0 + 5, T0 + 9) == [(T0 + 5, 10)]  # a scrape at the start opens the window
    assert read(T0 + 10, T0 + 10) == [(T0 + 10, 20)]
    assert read(T0 - 1, T0 + 20) == [(T0, 0), (T0 + 5, 10), (T0 + 10, 20)]  # nothing before the first: no opening
    assert read(T0 + 10 + LOOKBACK_S + 1, T0 + 300) == []  # too long silent to open a window
