"""The same fleet read through both metrics backends gives the alert evaluator and the autoscaler the same figures.

Simulated workers (`python -m inference.worker --simulate`, one prefill, two decode) behind a real gateway serve a
burst of load; a third decode worker holds a slot but answers nothing. A real Prometheus (Debian's `prometheus`)
scrapes them every second with Tandem's recording rules, while the embedded store scrapes the same processes every
second too. About a minute later both readers answer the evaluator's reads (read_observations) and the autoscaler's
(load_inputs): P99s must agree within one histogram bucket, rates within 5 %, and the silent worker reads as down
with no data in both.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from datetime import datetime, timezone

import pytest
import requests

from controlplane.alerting.models import AlertRule
from controlplane.alerting.services.evaluation import read_observations
from controlplane.autoscaling.autoscaler import load_inputs
from controlplane.models import Pool
from controlplane.observability.prometheus import sd_targets
from controlplane.observability.recording_rules import rules_file
from controlplane.observability.store import scrape_cycle
from inference.metrics import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS
from tests.inference.gateway.support import start_gateway, stop_all
from tests.inference.worker.sim.test_gateway_in_front import start_simulated
from tests.procs import free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package `prometheus`)")]

# Scrapes and rule evaluations every INTERVAL_S, rates and quantiles over WINDOW_S. The load is one burst of BURST_S
# after WARMUP_S; reads READ_AT_S after the burst began cover the last READ_WINDOW_S, whose every value has the whole
# burst in its window and a full window of scrapes behind it: both backends then count the same requests. (With a
# steady load, a second's offset between the two scrapers moves a P99 made of a few outliers on a busy machine; with
# less history than a window, the embedded store divides by the span it has, Prometheus by the range. Left: the
# embedded span reaches back to the scrape before the window, Prometheus extrapolates its samples to the window,
# about one interval in WINDOW_S apart for a burst.)
INTERVAL_S, WINDOW_S, WARMUP_S, BURST_S, READ_AT_S, READ_WINDOW_S = 1, 60, 40, 10, 30, 5
BUCKETS = {"ttft": TTFT_BUCKETS, "itl": ITL_BUCKETS, "e2e": E2E_BUCKETS}


@pytest.fixture
def sim_fleet(tmp_path):
    workers = start_simulated([("prefill", "prefill"), ("decode-a", "decode"), ("decode-b", "decode")], tmp_path)
    procs = list(workers.values())
    try:
        gateway = start_gateway("gw", ["--prefill", workers["prefill"].url, "--decode",
                                       f"{workers['decode-a'].url},{workers['decode-b'].url}",
                                       "--served-model-name", "sim"], tmp_path)
        procs.append(gateway)
        yield workers, gateway
    finally:
        stop_all(procs)


@pytest.fixture
def registered(deployment, make_worker, sim_fleet):
    workers, gateway = sim_fleet
    for proc, role in ((workers["prefill"], "prefill"), (workers["decode-a"], "decode"),
                       (workers["decode-b"], "decode"), (gateway, "gateway")):
        make_worker(deployment, role, port=int(proc.url.rsplit(":", 1)[1]))
    make_worker(deployment, "decode", port=free_port())  # holds a slot, answers nothing: up 0, no other series
    return deployment, gateway


@pytest.fixture
def prometheus(registered, tmp_path):
    """A real Prometheus scraping the deployment's workers (the labels of Tandem's service discovery) every second,
    with Tandem's recording rules over WINDOW_S."""
    (tmp_path / "rules.yml").write_text(rules_file(window_s=WINDOW_S, interval_s=INTERVAL_S))
    config = {"global": {"scrape_interval": f"{INTERVAL_S}s", "scrape_timeout": f"{INTERVAL_S}s",
                         "evaluation_interval": f"{INTERVAL_S}s"},
              "rule_files": [str(tmp_path / "rules.yml")],
              "scrape_configs": [{"job_name": "tandem", "static_configs": sd_targets()}]}
    (tmp_path / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    with open(tmp_path / "prometheus.log", "wb") as log:
        proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}",
                                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not _ready(url):
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            assert time.monotonic() < deadline, "Prometheus not ready within 60 s"
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _ready(url: str) -> bool:
    try:
        return requests.get(f"{url}/-/ready", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _load(gateway_url: str, stop: threading.Event, num_threads: int = 3, period_s: float = 0.3) -> list:
    """Steady traffic: each thread starts a completion every period_s (catching up after a slow one)."""
    errors: list = []

    def run():
        session, due = requests.Session(), time.monotonic()
        while not stop.is_set():
            try:
                session.post(f"{gateway_url}/v1/completions", timeout=30,
                             json={"model": "sim", "prompt": "one two three four", "max_tokens": 6}
                             ).raise_for_status()
            except requests.RequestException as exc:
                errors.append(exc)
            due += period_s
            stop.wait(max(due - time.monotonic(), 0))

    threads = [threading.Thread(target=run, daemon=True) for _ in range(num_threads)]
    for thread in threads:
        thread.start()
    return threads


def _bucket_width(metric: str, value: float) -> float:
    bounds = (0.0, *BUCKETS[metric.split("_")[0]])
    for low, high in zip(bounds, bounds[1:]):
        if value <= high:
            return high - low
    return float("inf")


def _agree(metric: str, embedded: float | None, prometheus: float | None, *, silent: bool = False) -> None:
    if silent:  # the worker that does not answer: no data in both, not 0
        assert embedded is None and prometheus is None, (metric, embedded, prometheus)
        return
    assert embedded is not None and prometheus is not None, (metric, embedded, prometheus)
    if "_p99_" in metric or "_p50_" in metric:
        assert abs(embedded - prometheus) <= _bucket_width(metric, max(embedded, prometheus)), \
            (metric, embedded, prometheus)
    elif metric == "up" or metric.endswith("_ratio"):
        assert embedded == pytest.approx(prometheus, abs=0.01), (metric, embedded, prometheus)
    else:
        assert embedded == pytest.approx(prometheus, rel=0.05), (metric, embedded, prometheus)


READS = [  # (metric, role, aggregation, per_worker): what alert rules read
    ("ttft_p99_seconds", "prefill", "avg", False),
    ("itl_p99_seconds", "decode", "max", False),
    ("itl_p99_seconds", "decode", "last", True),
    ("e2e_p99_seconds", "gateway", "avg", False),
    ("qps", "decode", "avg", True),
    ("qps", "gateway", "avg", False),
    ("generation_tokens_per_second", "decode", "avg", False),
    ("error_ratio", "gateway", "max", False),
    ("up", "decode", "min", True),
    ("up", "decode", "last", False),
]


def _scrape_until(moment: float) -> None:
    """The embedded store scrapes the same processes on the same cadence as Prometheus."""
    while time.time() < moment:
        scrape_cycle()
        time.sleep(max(INTERVAL_S - time.time() % INTERVAL_S, 0.05))


def test_the_evaluator_and_the_autoscaler_read_the_same_figures_from_both_backends(registered, prometheus,
                                                                                   settings):
    deployment, gateway = registered
    settings.TANDEM_SCRAPE_INTERVAL_S, settings.TANDEM_SCRAPE_WINDOW_S = INTERVAL_S, WINDOW_S
    # A few requests first, so that every labelled series (the gateway's per revision) exists before the window:
    # a series born inside it restarts the embedded store's ring (a shorter span), as it has no earlier value.
    for _ in range(3):
        requests.post(f"{gateway.url}/v1/completions", timeout=30,
                      json={"model": "sim", "prompt": "one two", "max_tokens": 2}).raise_for_status()
    scrapes_from = time.time()
    _scrape_until(scrapes_from + WARMUP_S)
    stop = threading.Event()
    threads = _load(gateway.url, stop)
    burst_start = time.time()
    try:
        _scrape_until(burst_start + BURST_S)
    finally:
        stop.set()
        for thread in threads:
            thread.join(35)
    burst_end = time.time()
    _scrape_until(burst_start + READ_AT_S)
    scrape_cycle()
    now = time.time()
    # Every value read (the last READ_WINDOW_S) has the whole burst in its rate window, with a scrape either side,
    # and scrapes over all of its window.
    assert (burst_end + 2 * INTERVAL_S < now - READ_WINDOW_S and now - WINDOW_S < burst_start - 2 * INTERVAL_S
            and now - READ_WINDOW_S - WINDOW_S > scrapes_from + 2 * INTERVAL_S), \
        f"too slow for the timeline: burst {burst_end - burst_start:.1f} s, read at +{now - burst_start:.1f} s"
    reads = {}
    for backend, url in (("embedded", ""), ("prometheus", prometheus)):
        settings.TANDEM_METRICS_BACKEND, settings.TANDEM_PROMETHEUS_URL = backend, url
        at = datetime.fromtimestamp(now, tz=timezone.utc)
        evaluator = {}
        for metric, role, aggregation, per_worker in READS:
            rule = AlertRule(metric=metric, role=role, aggregation=aggregation, window_s=READ_WINDOW_S,
                             per_worker=per_worker, compare_to_offset_s=0)
            for obs in read_observations(rule, now=at, deployment_ids=[deployment.pk]):
                evaluator[(metric, aggregation, obs.role, obs.worker_id)] = obs.value
        pools = list(Pool.objects.filter(deployment=deployment))
        reads[backend] = (evaluator, load_inputs(pools, now=now).latest)

    (embedded_rules, embedded_latest), (prometheus_rules, prometheus_latest) = reads["embedded"], reads["prometheus"]
    assert set(embedded_rules) == set(prometheus_rules)
    assert len(embedded_rules) == 16  # per worker: 3 decode workers in 3 reads; per pool: 7 reads
    dead = max(key[3] or 0 for key in embedded_rules)
    for key, value in embedded_rules.items():
        _agree(key[0], value, prometheus_rules[key], silent=key[3] == dead and key[0] != "up")
    assert embedded_rules[("up", "min", "decode", dead)] == prometheus_rules[("up", "min", "decode", dead)] == 0.0
    assert prometheus_rules[("up", "last", "decode", None)] == pytest.approx(2 / 3)
    for key in [(deployment.pk, "prefill", "ttft_p99_seconds"), (deployment.pk, "decode", "itl_p99_seconds"),
                (deployment.pk, "prefill", "qps"), (deployment.pk, "decode", "qps")]:
        _agree(key[2], embedded_latest.get(key), prometheus_latest.get(key))
