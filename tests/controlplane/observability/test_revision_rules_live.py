"""The per-revision recording rules (tandem_revision:<series>{deployment, revision}) compute each revision's series
from what a real Prometheus scrapes: a gateway-style /metrics whose counters grow at known rates per revision, and
a decode worker whose target carries `revision` too (http_sd labels every worker with its revision) and must not
count. The rollout page's read (reader().revision_range) then draws those rates."""
from __future__ import annotations

import threading
import time

import pytest

from controlplane.observability.promql import PrometheusReader
from controlplane.observability.reader import reader
from controlplane.observability.recording_rules import rules_file
from tests.controlplane.observability.seeded_prometheus import PROMETHEUS, Prometheus
from tests.controlplane.rollouts.conftest import FakeGatewayMetrics

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package `prometheus`)")]
# revision → requests per second served (ok, errors) and their end-to-end latency
TRAFFIC = {1: (20.0, 0.0, 0.3), 2: (8.0, 2.0, 0.7)}


class Growing:
    """Moves a FakeGatewayMetrics' counters on every 0.1 s, as TRAFFIC says, until stopped."""

    def __init__(self, server: FakeGatewayMetrics, traffic: dict) -> None:
        self.server, self.traffic, self.started = server, traffic, time.monotonic()
        self.stopped = threading.Event()
        self.tick()
        threading.Thread(target=self.run, daemon=True).start()

    def tick(self) -> None:
        elapsed = time.monotonic() - self.started
        self.server.revisions = {revision: {"ok": ok * elapsed, "errors": errors * elapsed, "e2e": e2e}
                                 for revision, (ok, errors, e2e) in self.traffic.items()}

    def run(self) -> None:
        while not self.stopped.wait(0.1):
            self.tick()


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """A real Prometheus scraping a gateway and a decode worker every 0.5 s, with Tandem's rules (3 s rates) every second."""
    gateway, worker = FakeGatewayMetrics(), FakeGatewayMetrics()
    growing = [Growing(gateway, TRAFFIC), Growing(worker, {1: (50.0, 5.0, 2.0)})]
    directory = tmp_path_factory.mktemp("revision-rules")
    (directory / "tandem.yml").write_text(rules_file(window_s=3, interval_s=1))
    labels = {"deployment": "demo", "node": "local"}
    config = {"global": {"scrape_interval": "500ms", "scrape_timeout": "500ms"},
              "rule_files": [str(directory / "tandem.yml")],
              "scrape_configs": [{"job_name": "tandem", "static_configs": [
                  {"targets": [f"127.0.0.1:{gateway.port}"],
                   "labels": {**labels, "pool": "gateway", "worker": "9001", "revision": ""}},
                  {"targets": [f"127.0.0.1:{worker.port}"],
                   "labels": {**labels, "pool": "decode", "worker": "9002", "revision": "1"}}]}]}
    prometheus = Prometheus(directory / "data", directory, config=config)
    yield prometheus
    prometheus.stop()
    for grower in growing:
        grower.stopped.set()
    gateway.close()
    worker.close()


def _recorded(url: str, metric: str) -> dict[str, float]:
    answer = PrometheusReader(url=url, timeout_s=5).query(f'tandem_revision:{metric}{{deployment="demo"}}',
                                                         at=time.time())
    return {item["metric"]["revision"]: float(item["value"][1]) for item in answer}


def test_each_revisions_rates_ratios_and_p99_come_from_the_gateway_only(scraped):
    deadline = time.monotonic() + 60
    while True:  # the rates settle once the 3 s window holds scrapes of steady growth
        qps = _recorded(scraped.url, "qps")
        if set(qps) == {"1", "2"} and qps["1"] == pytest.approx(20.0, rel=0.05) \
                and qps["2"] == pytest.approx(10.0, rel=0.05):
            break
        assert time.monotonic() < deadline, f"tandem_revision:qps never settled: {qps}"
        time.sleep(0.5)
    errors = _recorded(scraped.url, "error_ratio")
    assert errors["1"] == 0.0 and errors["2"] == pytest.approx(0.2, rel=0.05)
    p99 = _recorded(scraped.url, "e2e_p99_seconds")
    assert 0.1 < p99["1"] <= 0.5 and 0.5 < p99["2"] <= 1.0  # within the bucket of 0.3 s and of 0.7 s


def test_the_rollout_pages_read_draws_the_recorded_rates(scraped, settings, deployment):
    settings.TANDEM_METRICS_BACKEND, settings.TANDEM_PROMETHEUS_URL = "prometheus", scraped.url
    wanted = {(1, "qps"): 20.0, (2, "qps"): 10.0}
    deadline = time.monotonic() + 60
    while True:  # the newest whole step, once the rates settled (the first seconds' windows are partly empty)
        end = time.time()
        found = reader().revision_range(deployment_id=deployment.pk, revisions=[1, 2], metrics=["qps"],
                                        start=end - 10, end=end, step=2)
        if set(found) == set(wanted) and all(len(found[key]) >= 2 and abs(found[key][-2][1] / rate - 1) < 0.1
                                             for key, rate in wanted.items()):
            break
        assert time.monotonic() < deadline, f"the revision series never drew the gateway's rates: {found}"
        time.sleep(0.5)
