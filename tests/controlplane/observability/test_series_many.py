"""query_series_many answers each query as query_series does alone, however the queries group (one metric or
several per scope, raw and rollup sources, an empty scope, a metric asked twice); and latest_pool_values with named
roles reads what it reads without them, for those roles."""
from __future__ import annotations

import math

import pytest

from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Rollup, Sample
from controlplane.observability.series import SeriesQuery, latest_pool_values, query_series, query_series_many

pytestmark = pytest.mark.django_db

NOW = 1_800_000_000.0
METRICS = ("qps", "ttft_p99_seconds", "kv_cache_usage_ratio")


def _seed(deployment, series):
    samples, rollups = [], []
    for index, (role, worker_id) in enumerate(series):
        for m, metric in enumerate(METRICS):
            for i in range(400):  # the last 2,000 s as 5-second samples
                samples.append(Sample(ts=NOW - 2000 + i * 5 + 0.25, deployment_id=deployment.pk, role=role,
                                      worker_id=worker_id, metric=METRIC_IDS[metric],
                                      value=index + m * 10 + math.sin(i / 7.0)))
            # the day before as rollups, up to 10 minutes before the raw samples end
            for minute in range(int((NOW - 86400) // 60) * 60, int(NOW // 60) * 60 - 600, 60):
                rollups.append(Rollup(ts=float(minute), deployment_id=deployment.pk, role=role, worker_id=worker_id,
                                      metric=METRIC_IDS[metric], avg=index + m + (minute % 977) / 100.0, min=0.0,
                                      max=20.0, count=12 if minute % 120 else 7))
    Sample.objects.bulk_create(samples)
    Rollup.objects.bulk_create(rollups)


@pytest.mark.parametrize("span,step", [(1800, 5.0), (3600, 12.0), (86400, 288.0)])
def test_many_queries_read_together_answer_as_each_alone(deployment, make_worker, span, step):
    a, b = make_worker(deployment, "decode"), make_worker(deployment, "prefill")
    _seed(deployment, [("gateway", None), ("decode", None), ("prefill", None), ("decode", a.pk), ("prefill", b.pk)])
    roles = ("prefill", "decode", "gateway")
    scopes = [(roles, None), (roles, (a.pk, b.pk)), (("decode",), (a.pk,)), (("decode",), ())]
    queries = [SeriesQuery(metric=metric, deployment_id=deployment.pk, role=role, worker=worker, start=NOW - span,
                           end=NOW, step=step) for role, worker in scopes for metric in METRICS]
    queries.append(queries[1])  # one metric asked twice
    together = query_series_many(queries, now=NOW)
    alone = [query_series(query, now=NOW) for query in queries]
    assert together == alone
    assert sum(1 for _, series in together if series) == len(METRICS) * 3 + 1  # only the empty scope reads nothing
    assert {source for source, _ in together} == {"raw" if span <= 3600 else "rollup"}


def test_latest_pool_values_with_named_roles_reads_those_roles_as_without(deployment):
    _seed(deployment, [("gateway", None), ("decode", None), ("prefill", None)])
    everything = latest_pool_values(deployment_ids=[deployment.pk], metrics=METRICS, window_s=60, now=NOW)
    named = latest_pool_values(deployment_ids=[deployment.pk], metrics=METRICS, window_s=60, now=NOW,
                               roles={"prefill", "decode"})
    assert named and named == {key: value for key, value in everything.items() if key[1] != "gateway"}
