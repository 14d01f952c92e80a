"""Both metrics backends give a gateway's window the same counters: the embedded scrape and a real Prometheus
(Debian's `prometheus`, scraping the same page every second with the labels of Tandem's service discovery) read
one gateway before and after its traffic moves, and the window between them opens and closes on the same snapshots,
so that chaos reads the same requests, errors, migrations, retries and P99s from either. With Prometheus
unreachable the read raises MetricsUnavailable (a check then has no data, which never passes)."""
from __future__ import annotations

import time

import pytest

from controlplane.models import WorkerRole
from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.observability.scraper import Target
from controlplane.observability.store import scrape_cycle
from controlplane.rollouts.analysis import window_numbers
from tests.controlplane.observability.seeded_prometheus import PROMETHEUS, Prometheus
from tests.controlplane.observability.servers import MetricsServers
from tests.controlplane.observability.test_gateway_counters import GatewayPage
from tests.procs import free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package `prometheus`)")]
GATEWAY_ID = 9002  # the gateway Worker's id, which Prometheus' target carries as its `worker` label


@pytest.fixture
def scraped(tmp_path):
    """A gateway page, and a real Prometheus scraping it every second as Tandem's http_sd would label it."""
    servers = MetricsServers()
    page = GatewayPage()
    page.port = servers.serve(page.render)
    labels = {"deployment": "demo", "pool": "gateway", "worker": str(GATEWAY_ID), "node": "local"}
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
              "scrape_configs": [{"job_name": "tandem", "static_configs": [
                  {"targets": [f"127.0.0.1:{page.port}"], "labels": labels}]}]}
    prometheus = Prometheus(tmp_path / "data", tmp_path, config=config)
    yield page, prometheus
    prometheus.stop()
    servers.close()


def _newest(target: Target, *, success: float) -> None:
    """Returns once each backend's newest scrape shows `success` requests (the embedded one scrapes first)."""
    from django.conf import settings

    deadline = time.monotonic() + 30
    for backend in ("embedded", "prometheus"):
        settings.TANDEM_METRICS_BACKEND = backend
        while True:
            if backend == "embedded":
                scrape_cycle()
            now = time.time()
            seen = reader().gateway_counters(target, start=now, end=now)
            if seen and seen[-1]["snapshot"]["c"]["success"] == success:
                break
            assert time.monotonic() < deadline, f"{backend} reads {seen}"
            time.sleep(0.2)


def test_both_backends_open_and_close_a_window_on_the_same_counters(deployment, make_worker, scraped, settings):
    page, prometheus = scraped
    settings.TANDEM_PROMETHEUS_URL = prometheus.url
    gateway = make_worker(deployment, WorkerRole.GATEWAY, port=page.port, id=GATEWAY_ID)
    target = Target(gateway.pk, deployment.pk, WorkerRole.GATEWAY, gateway.url)
    page.revisions = {1: {"ok": 10, "ttft": 0.03}}
    _newest(target, success=10)
    start = time.time()
    time.sleep(0.5)  # no scrape that began before `start` reads what follows
    page.revisions = {1: {"ok": 40, "errors": 5, "ttft": 0.03}, 2: {"ok": 3, "errors": 2, "ttft": 0.3}}
    page.client_errors, page.migrations, page.retries = 4, 2, 1
    _newest(target, success=43)
    end = time.time()

    windows = {}
    for backend in ("embedded", "prometheus"):
        settings.TANDEM_METRICS_BACKEND = backend
        scrapes = reader().gateway_counters(target, start=start, end=end)
        assert scrapes[0]["ts"] <= start < scrapes[-1]["ts"] <= end, backend
        windows[backend] = (scrapes[0]["snapshot"], scrapes[-1]["snapshot"])
    assert windows["embedded"] == windows["prometheus"]
    numbers = window_numbers(*windows["prometheus"])
    assert (numbers["requests"], numbers["errors"], numbers["server_errors"]) == (44, 11, 7)
    assert windows["prometheus"][1]["c"]["migrations"] == 2 and windows["prometheus"][1]["c"]["retries"] == 2
    # The window observed 40 first tokens, 5 of them in the 0.5 s bucket: the P99 is interpolated inside it.
    assert numbers["ttft_p99_seconds"] == pytest.approx(0.1 + 0.4 * (0.99 * 40 - 35) / 5)


def test_with_prometheus_unreachable_the_read_raises(deployment, make_worker, settings):
    gateway = make_worker(deployment, WorkerRole.GATEWAY, id=GATEWAY_ID)
    settings.TANDEM_METRICS_BACKEND = "prometheus"
    settings.TANDEM_PROMETHEUS_URL, settings.TANDEM_PROMETHEUS_TIMEOUT_S = f"http://127.0.0.1:{free_port()}", 1
    with pytest.raises(MetricsUnavailable):
        reader().gateway_counters(Target(gateway.pk, deployment.pk, WorkerRole.GATEWAY, gateway.url),
                                  start=time.time() - 10, end=time.time())
