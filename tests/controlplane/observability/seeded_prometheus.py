"""The same recorded series in both metrics backends, for tests that compare what pages and range reads get from
each, without waiting for a scrape.

Every series the deployment page reads (its charts, stage columns and current values: `page_metrics()`) is written
at SPAN_S of 5 s samples ending at T0, per pool (`tandem_pool:<series>{deployment, pool}`) and per worker
(`tandem_worker:<series>{deployment, pool, worker}`) of deployment "demo", whose workers have the ids of WORKERS:

- into Prometheus as its recording rules would have recorded them: an OpenMetrics file turned into TSDB blocks by
  `promtool tsdb create-blocks-from openmetrics`, served by a real `prometheus` started on that data directory
  (ready in about a second: nothing to scrape, no rule to wait for);
- into the embedded store as its scrape cycle would have stored them (`seed_embedded`: Sample rows).

What this checks is the reading (range queries, steps, scopes, errors); that Prometheus' recording rules compute
what the embedded scrape computes is test_backends_agree's subject, with a live scrape. Samples sit 1.3 s after a
multiple of 5 s from T0, never on the edge of a chart's bucket, where the embedded store's [t, t + step) and
Prometheus' closed range selector [t, t + step] would each take a sample the other leaves.
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import zlib
from pathlib import Path

import pytest
import requests

from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.recording_rules import POOL_PREFIX, WORKER_PREFIX, recorded_metrics
from tests.procs import free_port

PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")
DEPLOYMENT = "demo"
WORKERS = {7001: "prefill", 7002: "decode", 7003: "decode", 7004: "gateway"}  # id → role
ROLES = ("prefill", "decode", "gateway")
INTERVAL_S, SPAN_S, OFFSET_S = 5, 1200, 1.3


def page_metrics() -> list[str]:
    """The series the deployment page reads on a GPU host and on a CPU host, that Prometheus records."""
    from dashboards.panels import panels_for
    from dashboards.stages import GPU_HEALTH, stage_indicators

    names = set()
    for has_gpu in (True, False):
        names |= {line.metric for panel in panels_for(has_gpu=has_gpu) for line in panel.lines}
        for stage in ("prefill", "decode"):
            for indicator in stage_indicators(stage, has_gpu=has_gpu):
                names |= {line.metric for line in indicator.lines} | {indicator.value_metric} - {""}
    names |= {line.metric for indicator in GPU_HEALTH for line in indicator.lines}
    return sorted(names & recorded_metrics())


def value(metric: str, role: str, worker_id: int | None, k: int) -> float:
    """The k-th sample of a series: a positive wave of its own phase and size (ratios stay within 0..1)."""
    seed = zlib.crc32(f"{metric}/{role}/{worker_id}".encode())
    wave = 0.5 + 0.4 * math.sin(k / 7 + seed % 97)
    return wave if metric.endswith("_ratio") else wave * (1 + seed % 50)


def samples(t0: float) -> list[tuple[float, str, str, int | None, float]]:
    """(ts, metric, role, worker id or None, value) of every seeded series, in series then time order."""
    num = SPAN_S // INTERVAL_S
    keys = [(metric, role, None) for metric in page_metrics() for role in ROLES]
    keys += [(metric, role, wid) for metric in page_metrics() for wid, role in WORKERS.items()]
    return [(t0 - SPAN_S + k * INTERVAL_S + OFFSET_S, metric, role, wid, value(metric, role, wid, k))
            for metric, role, wid in keys for k in range(num)]


def bucket_means(rows, *, metric: str, role: str, worker_id: int | None, start: float, end: float,
                 step: float) -> list[list[float]]:
    """What a range read must answer for one series: [[bucket start, mean of its samples in [t, t + step)]]."""
    buckets: dict[int, list[float]] = {}
    for ts, name, row_role, wid, number in rows:
        if (name, row_role, wid) == (metric, role, worker_id) and start <= ts < end:
            buckets.setdefault(math.floor((ts - start) / step), []).append(number)
    return [[start + i * step, sum(values) / len(values)] for i, values in sorted(buckets.items())]


def seed_embedded(deployment_id: int, rows) -> None:
    from controlplane.observability.store import _insert_samples

    _insert_samples([(ts, deployment_id, role, wid, METRIC_IDS[metric], number)
                     for ts, metric, role, wid, number in rows])


def write_blocks(rows, directory: Path, *names: str) -> list[Path]:
    """The rows as Prometheus TSDB blocks (what the recording rules would have written), one data directory under
    `directory` per name: each Prometheus needs its own."""
    by_name: dict[str, list[str]] = {}
    for ts, metric, role, wid, number in rows:
        name = f"{POOL_PREFIX if wid is None else WORKER_PREFIX}{metric}"
        labels = f'deployment="{DEPLOYMENT}",pool="{role}"' + ("" if wid is None else f',worker="{wid}"')
        by_name.setdefault(name, []).append(f"{name}{{{labels}}} {number!r} {ts:.3f}")
    text = "".join(f"# TYPE {name} gauge\n" + "\n".join(lines) + "\n" for name, lines in by_name.items())
    (directory / "seeded.om").write_text(text + "# EOF\n")
    for name in names:
        subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--quiet",
                        str(directory / "seeded.om"), str(directory / name)], check=True, capture_output=True,
                       timeout=120)
    return [directory / name for name in names]


class Prometheus:
    """A real `prometheus` serving a data directory (by default no scrape job and no rules), on a free port."""

    def __init__(self, data: Path, directory: Path, *extra_args: str, config: dict | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "prometheus.yml").write_text(json.dumps(config or {"global": {}}))  # JSON is YAML
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = directory / "prometheus.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [PROMETHEUS, f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={data}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", *extra_args],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not self._ready():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "Prometheus not ready within 60 s"
            time.sleep(0.1)

    def _ready(self) -> bool:
        try:
            return requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def serving(rows, directory: Path) -> Prometheus:
    """A Prometheus over these rows alone (ts, metric, role, worker id or None, value), as the recording rules
    would have recorded them: for a module that seeds its own scenarios rather than the pages' series."""
    [data] = write_blocks(rows, directory, "data")
    return Prometheus(data, directory / "serving")


class Seeded:
    """The seeded series (T0, rows) and the Prometheus processes over them: `serving` answers every query;
    `refusing()` starts (once) a second one whose every query of more than 10 samples fails with a PromQL
    execution error (`--query.max-samples=10`): a real error answer, as a too heavy or invalid query gets."""

    def __init__(self, directory: Path) -> None:
        self.t0 = float(math.floor(time.time()))  # a whole second, a little before the tests read
        self.rows = samples(self.t0)
        self._directory = directory
        self._data, self._refusing_data = write_blocks(self.rows, directory, "data", "data-refusing")
        self.serving = Prometheus(self._data, directory / "serving")
        self._refusing: Prometheus | None = None

    def refusing(self) -> Prometheus:
        if self._refusing is None:
            self._refusing = Prometheus(self._refusing_data, self._directory / "refusing", "--query.max-samples=10")
        return self._refusing

    def stop(self) -> None:
        for prometheus in (self.serving, self._refusing):
            if prometheus is not None:
                prometheus.stop()


# --- fixtures (import them into a test module) --------------------------------------------------------------------

@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    """One Seeded per test module (its Prometheus starts in about a second)."""
    if PROMETHEUS is None or PROMTOOL is None:
        pytest.skip("prometheus/promtool not installed (Debian package `prometheus`)")
    data = Seeded(tmp_path_factory.mktemp("seeded-prometheus"))
    yield data
    data.stop()


@pytest.fixture
def seeded_deployment(seeded, deployment, make_worker):
    """Deployment "demo", created an hour before T0, with its WORKERS ready (no samples anywhere yet)."""
    from datetime import datetime, timedelta, timezone

    from controlplane.models import Deployment

    for worker_id, role in WORKERS.items():
        make_worker(deployment, role, id=worker_id)
    created = datetime.fromtimestamp(seeded.t0, tz=timezone.utc) - timedelta(hours=1)
    Deployment.objects.filter(pk=deployment.pk).update(created_at=created)
    deployment.created_at = created
    return deployment


def use_backend(name: str, settings, seeded, deployment) -> None:
    """Read from `name`: the embedded store gets the seeded rows, Prometheus mode points at the serving one."""
    settings.TANDEM_METRICS_BACKEND = name
    if name == "prometheus":
        settings.TANDEM_PROMETHEUS_URL = seeded.serving.url
    else:
        seed_embedded(deployment.pk, seeded.rows)


@pytest.fixture(params=["embedded", "prometheus"])
def backend(request, settings, seeded, seeded_deployment):
    """The metrics backend of the test, with the seeded series in that backend only: the embedded store holds no
    sample in prometheus mode, so whatever a read finds came from Prometheus."""
    use_backend(request.param, settings, seeded, seeded_deployment)
    return request.param
