"""The deployment page, its live fragment and its chart data read a fixed number of queries: a deployment of 14
workers costs what one of 2 costs (no query per worker, per chart or per line), and the chart data reads all its
lines in a few grouped queries whatever the range."""
from __future__ import annotations

import time

import pytest
from django.db import connection, reset_queries
from django.test.utils import CaptureQueriesContext

pytestmark = pytest.mark.django_db

URLS = ("/deployments/demo/", "/deployments/demo/live", "/deployments/demo/charts.json?range=15m",
        "/deployments/demo/charts.json?range=24h", "/deployments/demo/stages.json?range=15m",
        "/deployments/demo/stages.json?range=24h")
# What the views read beside the series (session, user, role, deployment, pools, workers, alerts, actions, ...),
# then the series: charts.json reads its pool lines and its per-worker lines in one grouped query each per source.
# The page's chaos card reads 4 more (opt-in, experiments, game days, runs: dashboards/chaos.py), and its pools
# card 2 (the autoscaler's mode and budget, each pool's open advice), which the live fragment's bound already held.
MAX_QUERIES = {"/deployments/demo/": 26, "/deployments/demo/live": 14, "charts.json": 16, "stages.json": 22}


def _day_old(deployment):
    from datetime import timedelta

    from controlplane.models import Deployment

    Deployment.objects.filter(pk=deployment.pk).update(created_at=deployment.created_at - timedelta(days=1))


def _counts(client) -> dict[str, int]:
    counts = {}
    for url in URLS:
        assert client.get(url).status_code == 200
        reset_queries()
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        counts[url] = len(queries)
    return counts


def _seed(deployment, workers, seed_samples):
    from controlplane.observability.catalog import METRIC_IDS
    from controlplane.observability.models import Rollup

    now = time.time()
    for worker in workers:
        for metric in ("gpu_utilization_ratio", "kv_cache_usage_ratio", "cpu_usage_ratio"):
            seed_samples(deployment, metric, [0.5, 0.6, 0.7], role=worker.role, worker=worker, end=now)
            Rollup.objects.bulk_create(
                [Rollup(ts=float(int(now // 60) * 60 - 3600 * h), deployment_id=deployment.pk, role=worker.role,
                        worker_id=worker.pk, metric=METRIC_IDS[metric], avg=0.5, min=0.4, max=0.6, count=12)
                 for h in range(2, 20)])
    for role in ("prefill", "decode", "gateway"):
        seed_samples(deployment, "ttft_p99_seconds", [0.2, 0.3], role=role, end=now)


def test_the_page_and_its_chart_data_read_as_many_queries_for_14_workers_as_for_2(
        client_for, viewer, deployment, make_worker, seed_samples):
    _day_old(deployment)
    client = client_for(viewer)
    workers = [make_worker(deployment, role) for role in ("prefill", "decode")]
    _seed(deployment, workers, seed_samples)
    few = _counts(client)
    more = [make_worker(deployment, role) for role in ("prefill", "decode") * 6]
    _seed(deployment, more, seed_samples)
    many = _counts(client)
    assert many == few
    for url, count in many.items():
        bound = next(limit for key, limit in MAX_QUERIES.items() if key in url)
        assert count <= bound, (url, count)


def test_the_24_hour_charts_draw_every_worker_from_the_grouped_reads(client_for, viewer, deployment, make_worker,
                                                                      seed_samples):
    _day_old(deployment)
    workers = [make_worker(deployment, role) for role in ("prefill", "decode") * 3]
    _seed(deployment, workers, seed_samples)
    figures = client_for(viewer).get("/deployments/demo/charts.json?range=24h").json()["figures"]
    names = {trace["name"] for trace in figures["kv"]["data"]}
    assert names == {f"{worker.role} #{worker.pk}" for worker in workers}
    assert all(len(trace["x"]) >= 19 for trace in figures["kv"]["data"])  # 18 rolled-up hours + the raw samples
    assert {trace["name"] for trace in figures["ttft"]["data"]} == {"P99 prefill", "P99 decode", "P99 gateway"}


def test_a_long_range_is_reused_for_a_tenth_of_its_step_and_a_short_one_never(client_for, viewer, deployment,
                                                                              make_worker, seed_samples):
    from dashboards.chart_cache import max_ages

    assert max_ages() == {"15m": 0, "1h": 0, "6h": 7, "24h": 28}
    _day_old(deployment)
    make_worker(deployment, "decode")
    client = client_for(viewer)
    seed_samples(deployment, "ttft_p99_seconds", [0.2], role="gateway")
    first = {key: client.get(f"/deployments/demo/charts.json?range={key}").json() for key in ("15m", "24h")}
    seed_samples(deployment, "ttft_p99_seconds", [0.9], role="gateway", end=time.time() - 30)
    again = {key: client.get(f"/deployments/demo/charts.json?range={key}").json() for key in ("15m", "24h")}
    assert again["24h"] == first["24h"]  # within 28 s: the same figures

    def num_points(doc):
        return sum(len(trace["x"]) for trace in doc["figures"]["ttft"]["data"])

    assert (num_points(first["15m"]), num_points(again["15m"])) == (1, 2)  # the new sample shows at once
    page = client.get("/deployments/demo/").content.decode()
    assert "up to 7 s old (6h), 28 s old (24h)" in page


def test_setting_an_objective_is_drawn_at_once_in_a_reused_range(client_for, operator, deployment, seed_samples):
    from controlplane.services.objectives import deployment_objectives_set

    _day_old(deployment)
    seed_samples(deployment, "ttft_p99_seconds", [0.2, 0.3], role="prefill")
    client = client_for(operator)

    def objective_line():
        figure = client.get("/deployments/demo/stages.json?range=24h").json()["figures"]["stage-prefill-ttft"]
        return [trace["y"] for trace in figure["data"] if trace["name"] == "objective P99"]

    before = objective_line()
    deployment_objectives_set(deployment=deployment, objectives={"ttft_p99_seconds": 0.4}, actor=operator)
    assert objective_line() != before
