"""The rollout page's per-revision charts read through the metrics backend: the same per-revision series seeded into
the embedded store (RevisionSample rows, as the scrape cycle stores them) and into a real Prometheus (TSDB blocks of
`tandem_revision:<series>{deployment, revision}`, as the recording rules would have recorded them) draw the same
points, each the mean of its step; a Prometheus that does not answer is drawn as that error on every chart."""
from __future__ import annotations

import math
import subprocess
import time
import zlib
from datetime import datetime, timezone

import pytest

from controlplane.models import WorkerRole
from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import RevisionSample
from controlplane.observability.recording_rules import REVISION_PREFIX
from controlplane.observability.series import auto_step
from controlplane.rollouts.models import Rollout
from dashboards.views.rollouts import CHART_METRICS, rollout_figures
from tests.controlplane.observability.seeded_prometheus import PROMETHEUS, PROMTOOL, Prometheus
from tests.procs import free_port

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(PROMETHEUS is None or PROMTOOL is None,
                                 reason="prometheus/promtool not installed (Debian package `prometheus`)")]
T0 = float(math.floor(time.time()))  # the page's now
CREATED = T0 - 900  # the rollout's start
SCALES = (1.0, 100.0, 1000.0)  # the units a chart may draw in: as stored, ratios as %, seconds as ms


def _value(metric: str, revision: int, k: int) -> float:
    wave = 0.5 + 0.4 * math.sin(k / 5 + zlib.crc32(f"{metric}/{revision}".encode()) % 97)
    return wave if metric.endswith("_ratio") else wave * (2 + revision)


# (ts, revision, metric, value): every 5 s from before the rollout to now, 1.3 s off a step's edge
ROWS = [(CREATED - 300 + 5 * k + 1.3, revision, metric, _value(metric, revision, k))
        for metric, _, _ in CHART_METRICS for revision in (1, 2) for k in range(240)]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    directory = tmp_path_factory.mktemp("rollout-charts")
    lines = {}
    for ts, revision, metric, value in ROWS:
        name = REVISION_PREFIX + metric
        lines.setdefault(name, []).append(f'{name}{{deployment="demo",revision="{revision}"}} {value!r} {ts:.3f}')
    (directory / "seeded.om").write_text("".join(f"# TYPE {name} gauge\n" + "\n".join(rows) + "\n"
                                                 for name, rows in lines.items()) + "# EOF\n")
    subprocess.run([PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", "--quiet", str(directory / "seeded.om"),
                    str(directory / "data")], check=True, capture_output=True, timeout=120)
    server = Prometheus(directory / "data", directory / "serving")
    yield server
    server.stop()


@pytest.fixture
def canary(deployment, operator, make_worker):
    from controlplane.rollouts.services import rollout_start
    from controlplane.services.revisions import revision_add

    make_worker(deployment, "prefill")
    make_worker(deployment, "decode")
    make_worker(deployment, WorkerRole.GATEWAY)
    revision_add(deployment=deployment, actor=operator, model_path=None, dtype=None, engine_settings=None)
    rollout = rollout_start(deployment=deployment, actor=operator, revision=2,
                            steps=[{"weight": 10, "duration_s": 60}])
    Rollout.objects.filter(pk=rollout.pk).update(created_at=datetime.fromtimestamp(CREATED, tz=timezone.utc))
    rollout.refresh_from_db()
    return rollout


@pytest.fixture(params=["embedded", "prometheus"])
def backend(request, settings, prometheus, canary):
    """The seeded series in the test's backend only."""
    settings.TANDEM_METRICS_BACKEND = request.param
    if request.param == "prometheus":
        settings.TANDEM_PROMETHEUS_URL = prometheus.url
    else:
        RevisionSample.objects.bulk_create([RevisionSample(ts=ts, deployment_id=canary.deployment_id,
                                                           revision=revision, metric=METRIC_IDS[metric], value=v)
                                            for ts, revision, metric, v in ROWS])
    return request.param


def _means(revision: int, metric: str, start: float, end: float, step: float) -> list[tuple[float, float]]:
    buckets: dict[int, list[float]] = {}
    for ts, row_revision, row_metric, value in ROWS:
        if (row_revision, row_metric) == (revision, metric) and start <= ts < end:
            buckets.setdefault(math.floor((ts - start) / step), []).append(value)
    return [(start + i * step, sum(values) / len(values)) for i, values in sorted(buckets.items())]


def test_both_backends_draw_each_revisions_step_means(backend, canary):
    now = datetime.fromtimestamp(T0, tz=timezone.utc)
    start, end = CREATED - 60, T0 + 60
    step = auto_step(start, end)
    figures = {figure["key"]: figure for figure in rollout_figures(canary, now=now)}
    assert set(figures) == {metric for metric, _, _ in CHART_METRICS}
    for metric, figure in figures.items():
        traces = {trace["name"]: trace for trace in figure["data"]}
        assert set(traces) == {"stable (#1)", "canary (#2)"}, metric
        for revision, trace in ((1, traces["stable (#1)"]), (2, traces["canary (#2)"])):
            means = _means(revision, metric, start, end, step)
            assert len(means) > 100, metric
            assert [x / 1000 for x in trace["x"]] == pytest.approx([t for t, _ in means], abs=0.002), metric
            scale = trace["y"][0] / means[0][1]
            assert min(SCALES, key=lambda s: abs(s - scale)) == pytest.approx(scale, rel=1e-6), metric
            assert trace["y"] == pytest.approx([v * scale for _, v in means], rel=1e-6), metric


def test_an_unreachable_prometheus_draws_every_chart_as_its_error(settings, canary):
    settings.TANDEM_METRICS_BACKEND = "prometheus"
    settings.TANDEM_PROMETHEUS_URL = f"http://127.0.0.1:{free_port()}"
    figures = rollout_figures(canary, now=datetime.fromtimestamp(T0, tz=timezone.utc))
    assert len(figures) == len(CHART_METRICS)
    for figure in figures:
        assert figure["data"] == []
        assert "did not answer" in figure["layout"]["meta"]["error"], figure["layout"]["meta"]
