"""reader().query_range and GET /api/v1/metrics/query give the same points from both metrics backends: the same
series seeded into the embedded store and into a real Prometheus (tests/controlplane/observability/
seeded_prometheus.py), each read must answer the mean of the samples in each step; a Prometheus that refuses the
query or does not answer is an error (MetricsUnavailable, a 503), never an empty answer."""
from __future__ import annotations

import pytest

from controlplane.observability.reader import MetricsUnavailable, reader
from controlplane.observability.series import SeriesQuery, auto_step
from tests.controlplane.observability.seeded_prometheus import (  # noqa: F401  (fixtures)
    SPAN_S, WORKERS, backend, bucket_means, seeded, seeded_deployment,
)
from tests.procs import free_port

pytestmark = pytest.mark.integration
SOURCES = {"embedded": "raw", "prometheus": "prometheus"}


def _expected(seeded, query: SeriesQuery, role: str, worker_id: int | None) -> list:
    return bucket_means(seeded.rows, metric=query.metric, role=role, worker_id=worker_id, start=query.start,
                        end=query.end, step=query.step)


def _assert_points(found: list, expected: list) -> None:
    assert [p[0] for p in found] == pytest.approx([p[0] for p in expected], abs=1e-6)
    assert [p[1] for p in found] == pytest.approx([p[1] for p in expected], rel=1e-9)


@pytest.mark.parametrize("minutes", [15, 60])
def test_each_point_is_the_mean_of_its_step_in_both_backends(backend, seeded, deployment, minutes):
    end = seeded.t0
    start = end - minutes * 60
    step = auto_step(start, end)  # 5 s (one sample a step) for 15 minutes, 12 s (two or three) for an hour
    assert step == (5 if minutes == 15 else 12)
    decode = tuple(wid for wid, role in WORKERS.items() if role == "decode")
    queries = [
        SeriesQuery("ttft_p99_seconds", deployment.pk, "prefill", None, start, end, step),
        SeriesQuery("qps", deployment.pk, ("decode", "gateway", "prefill"), None, start, end, step),
        SeriesQuery("kv_cache_usage_ratio", deployment.pk, "decode", decode, start, end, step),
        SeriesQuery("generation_tokens_per_second", deployment.pk, None, "all", start, end, step),
        SeriesQuery("itl_p99_seconds", deployment.pk, "decode", 7003, start, end, step),
    ]
    expected_keys = [
        [("prefill", None)],
        [("decode", None), ("gateway", None), ("prefill", None)],
        [("decode", 7002), ("decode", 7003)],
        sorted((role, wid) for wid, role in WORKERS.items()),
        [("decode", 7003)],
    ]
    answers = reader().query_range(queries, now=end)
    assert len(answers) == len(queries)
    for query, keys, (source, items) in zip(queries, expected_keys, answers):
        assert source == SOURCES[backend]
        assert sorted((item["role"], item["worker_id"]) for item in items) == keys, query
        for item in items:
            assert item["deployment_id"] == deployment.pk
            expected = _expected(seeded, query, item["role"], item["worker_id"])
            assert len(expected) >= min(minutes * 60, SPAN_S) / step - 1
            _assert_points(item["points"], expected)


def test_a_scope_that_selects_nothing_reads_no_series(backend, seeded, deployment):
    end = seeded.t0
    queries = [SeriesQuery("qps", deployment.pk, (), None, end - 900, end, 5),
               SeriesQuery("qps", deployment.pk, "decode", (), end - 900, end, 5),
               SeriesQuery("qps", deployment.pk, "colocated", None, end - 900, end, 5),
               SeriesQuery("qps", deployment.pk, "decode", None, end - 7200, end - 5400, 5)]  # before the data
    assert [items for _, items in reader().query_range(queries, now=end)] == [[], [], [], []]


def test_the_query_api_answers_the_same_series_from_both_backends(backend, seeded, viewer_api):
    end = seeded.t0
    response = viewer_api.get("/api/v1/metrics/query", {"metric": "e2e_p99_seconds", "deployment": "demo",
                                                        "worker": "all", "start": end - 600, "end": end, "step": 30})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["source"] == SOURCES[backend] and body["step"] == 30
    assert sorted((s["role"], s["worker_id"]) for s in body["series"]) == sorted(
        (role, wid) for wid, role in WORKERS.items())
    for item in body["series"]:
        assert item["deployment"] == "demo"
        expected = bucket_means(seeded.rows, metric="e2e_p99_seconds", role=item["role"],
                                worker_id=item["worker_id"], start=end - 600, end=end, step=30)
        assert len(expected) == 20
        _assert_points(item["points"], expected)


def test_a_query_prometheus_refuses_is_an_error_not_an_empty_answer(seeded, deployment, settings, viewer_api):
    settings.TANDEM_METRICS_BACKEND = "prometheus"
    settings.TANDEM_PROMETHEUS_URL = url = seeded.refusing().url
    end = seeded.t0
    with pytest.raises(MetricsUnavailable, match=rf"Prometheus at {url} refused a query \(execution: .*"
                                                 r"too many samples.*avg_over_time\(tandem_pool:qps"):
        reader().query_range([SeriesQuery("qps", deployment.pk, "decode", None, end - 900, end, 5)], now=end)
    response = viewer_api.get("/api/v1/metrics/query", {"metric": "qps", "deployment": "demo",
                                                        "start": end - 900, "end": end})
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "metrics_unavailable" and "too many samples" in error["message"]


def test_an_unreachable_prometheus_is_an_error(deployment, settings, viewer_api):
    url = f"http://127.0.0.1:{free_port()}"
    settings.TANDEM_METRICS_BACKEND, settings.TANDEM_PROMETHEUS_URL = "prometheus", url
    settings.TANDEM_PROMETHEUS_TIMEOUT_S = 1
    with pytest.raises(MetricsUnavailable, match=f"Prometheus at {url} did not answer"):
        reader().query_range([SeriesQuery("qps", deployment.pk, "decode", None, 0, 900, 5)], now=900)
    response = viewer_api.get("/api/v1/metrics/query", {"metric": "qps", "deployment": "demo"})
    assert response.status_code == 503
    assert response.json()["error"]["message"].startswith(f"Prometheus at {url} did not answer")
