"""The deployment page's charts, stage columns and current values read through the metrics backend: the same series
seeded into the embedded store and into a real Prometheus (tests/controlplane/observability/seeded_prometheus.py)
draw the same figures and values; a Prometheus that refuses the page's queries or does not answer is drawn as that
error on every chart (never an empty chart), and the pages still answer."""
from __future__ import annotations

import pytest

from controlplane.observability.models import Sample
from dashboards.panels import chart_figures
from dashboards.stages import stage_charts, stage_values
from dashboards.templatetags.dash import metric_value
from tests.controlplane.observability.seeded_prometheus import (  # noqa: F401  (fixtures)
    WORKERS, backend, bucket_means, seeded, seeded_deployment, use_backend,
)
from tests.procs import free_port

pytestmark = pytest.mark.integration
SCALES = (1.0, 100.0, 1000.0)  # seconds, ratios as %, seconds as ms (the units the checked traces have)


def _traces(figures: dict) -> dict[tuple[str, str], dict]:
    return {(key, trace["name"]): trace for key, figure in figures.items() for trace in figure["data"]}


def _assert_drawn(trace: dict, means: list) -> None:
    """The trace draws these [t, mean] points, in the chart's unit (whichever scale the chart chose)."""
    assert [x / 1000 for x in trace["x"]] == pytest.approx([t for t, _ in means], abs=0.002)
    scale = trace["y"][0] / means[0][1]
    assert min(SCALES, key=lambda s: abs(s - scale)) == pytest.approx(scale, rel=1e-6)
    assert trace["y"] == pytest.approx([v * scale for _, v in means], rel=1e-6)


def test_the_charts_and_stage_columns_draw_the_seeded_points_in_both_backends(backend, seeded, seeded_deployment):
    now = seeded.t0
    data = chart_figures(seeded_deployment, range_key="15m", now=now)
    assert data["error"] is None and data["step"] == 5 and data["start"] == now - 900
    traces = _traces(data["figures"])
    means = dict(rows=seeded.rows, start=data["start"], end=now, step=data["step"])
    _assert_drawn(traces[("ttft", "P99 prefill")], bucket_means(metric="ttft_p99_seconds", role="prefill",
                                                               worker_id=None, **means))
    _assert_drawn(traces[("qps", "QPS gateway")], bucket_means(metric="qps", role="gateway", worker_id=None, **means))
    _assert_drawn(traces[("kv", "decode #7003")], bucket_means(metric="kv_cache_usage_ratio", role="decode",
                                                              worker_id=7003, **means))
    assert {name for key, name in traces if key == "cpu"} == {f"{role} #{wid}" for wid, role in WORKERS.items()}
    assert all(trace["x"] for trace in traces.values())

    stages = stage_charts(seeded_deployment, range_key="15m", now=now)
    assert stages["error"] is None
    traces = _traces(stages["figures"])
    _assert_drawn(traces[("stage-decode-itl", "P99 decode")], bucket_means(metric="itl_p99_seconds", role="decode",
                                                                          worker_id=None, **means))
    _assert_drawn(traces[("stage-prefill-prefix_cache", "prefill #7001")],
                  bucket_means(metric="prefix_cache_hit_ratio", role="prefill", worker_id=7001, **means))
    # The current values: each pool's newest sample of the past minute.
    for column in stage_values(seeded_deployment, has_gpu=False, now=now):
        assert column["error"] is None
        for value in column["values"]:
            newest = [row[4] for row in seeded.rows if row[1:4] == (value["metric"], column["role"], None)][-1]
            assert value["value"] == pytest.approx(newest, rel=1e-9), value
            if value["key"] not in ("ttft", "itl", "compute"):  # objectives added; CPU per thread
                assert value["text"] == metric_value(newest, value["metric"])


def test_both_backends_give_the_page_the_same_figures(seeded, seeded_deployment, settings):
    now = seeded.t0
    read = {}
    for name in ("embedded", "prometheus"):
        Sample.objects.all().delete()
        use_backend(name, settings, seeded, seeded_deployment)
        read[name] = (chart_figures(seeded_deployment, range_key="1h", now=now),
                      stage_charts(seeded_deployment, range_key="1h", now=now))
    assert read["embedded"][0]["step"] == 12  # two or three samples in each point
    for embedded, prometheus in zip(read["embedded"], read["prometheus"]):
        embedded_traces, prometheus_traces = _traces(embedded["figures"]), _traces(prometheus["figures"])
        assert len(embedded_traces) > 20 and embedded_traces.keys() == prometheus_traces.keys()
        for key, trace in embedded_traces.items():
            assert prometheus_traces[key]["x"] == trace["x"], key
            assert prometheus_traces[key]["y"] == pytest.approx(trace["y"], rel=1e-9), key
    assert read["embedded"][1]["columns"] == read["prometheus"][1]["columns"]


def _assert_every_chart_shows(figures: dict, error_start: str, skip=()) -> int:
    num = 0
    for key, figure in figures.items():
        if key in skip:
            continue
        assert figure["data"] == [], key
        assert figure["layout"]["meta"]["error"].startswith(error_start), key
        assert "could not read the series" in figure["layout"]["annotations"][0]["text"]
        num += 1
    return num


def test_an_unreachable_prometheus_shows_on_every_chart_and_the_pages_still_answer(
        seeded_deployment, settings, client_for, viewer, fresh_cache):
    url = f"http://127.0.0.1:{free_port()}"
    settings.TANDEM_METRICS_BACKEND, settings.TANDEM_PROMETHEUS_URL = "prometheus", url
    settings.TANDEM_PROMETHEUS_TIMEOUT_S = 1
    client = client_for(viewer)
    charts = client.get("/deployments/demo/charts.json?range=15m").json()
    assert charts["error"].startswith(f"Prometheus at {url} did not answer")
    assert _assert_every_chart_shows(charts["figures"], f"Prometheus at {url} did not answer") == len(charts["order"])
    stages = client.get("/deployments/demo/stages.json?range=15m").json()
    assert stages["error"].startswith(f"Prometheus at {url} did not answer")
    # On a host without GPUs the health charts say so, whatever the backend.
    assert _assert_every_chart_shows(stages["figures"], f"Prometheus at {url} did not answer",
                                     skip=stages["health_order"]) == sum(len(c["order"]) for c in stages["columns"])
    assert {value["text"] for column in stages["columns"] for value in column["values"]} == {"unavailable"}
    page = client.get("/deployments/demo/")
    assert page.status_code == 200 and b"unavailable" in page.content
    overview = client.get("/")
    assert overview.status_code == 200
    assert f"metrics unavailable: Prometheus at {url} did not answer".encode() in overview.content


def test_a_query_prometheus_refuses_shows_as_an_error_and_is_not_kept_in_the_chart_cache(
        seeded, seeded_deployment, settings, client_for, viewer, fresh_cache):
    settings.TANDEM_METRICS_BACKEND = "prometheus"
    settings.TANDEM_PROMETHEUS_URL = url = seeded.refusing().url
    client = client_for(viewer)
    charts = client.get("/deployments/demo/charts.json?range=24h").json()  # a range whose answer is reused
    assert "too many samples" in charts["error"]
    _assert_every_chart_shows(charts["figures"], f"Prometheus at {url} refused a query (execution: ")
    settings.TANDEM_PROMETHEUS_URL = seeded.serving.url  # the operator fixes the query limit
    charts = client.get("/deployments/demo/charts.json?range=24h").json()
    assert charts["error"] is None and charts["figures"]["ttft"]["data"]
