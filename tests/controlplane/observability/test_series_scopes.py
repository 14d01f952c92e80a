"""query_series with named roles and worker ids (the deployment page's scopes) gives the same points as with every
role and `worker="all"` (the query API's), from raw samples and from rollups."""
from __future__ import annotations

import math

import pytest

from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Rollup, Sample
from controlplane.observability.series import SeriesQuery, query_series

pytestmark = pytest.mark.django_db

NOW = 1_800_000_000.0


def _seed(deployment, workers):
    rows = []
    for index, (role, worker_id) in enumerate([("gateway", None), ("decode", None)] + workers):
        for i in range(400):  # 2,000 s of 5-second samples, uneven values
            ts = NOW - 2000 + i * 5 + 0.25
            rows.append(Sample(ts=ts, deployment_id=deployment.pk, role=role, worker_id=worker_id,
                               metric=METRIC_IDS["qps"], value=index + math.sin(i / 7.0) + (i % 3)))
    Sample.objects.bulk_create(rows)


def _normalise(series):
    return sorted((s["role"], s["worker_id"], [(round(t, 6), round(v, 9)) for t, v in s["points"]])
                  for s in series)


@pytest.mark.parametrize("step", [5.0, 12.0, 60.0])
def test_named_roles_and_workers_read_the_same_raw_buckets(deployment, make_worker, step):
    a, b = make_worker(deployment, "decode"), make_worker(deployment, "prefill")
    _seed(deployment, [("decode", a.pk), ("prefill", b.pk)])
    start, end = NOW - 1800, NOW
    for worker, roles, named in ((None, ("gateway", "decode", "prefill"), None),
                                 ("all", ("decode", "prefill"), (a.pk, b.pk))):
        _, expected = query_series(SeriesQuery(metric="qps", deployment_id=deployment.pk, role=None, worker=worker,
                                               start=start, end=end, step=step), now=NOW)
        source, got = query_series(SeriesQuery(metric="qps", deployment_id=deployment.pk, role=roles, worker=named,
                                               start=start, end=end, step=step), now=NOW)
        assert source == "raw" and got and _normalise(got) == _normalise(expected)


def test_named_roles_and_workers_read_the_same_weighted_rollup_buckets(deployment, make_worker):
    worker = make_worker(deployment, "decode")
    rows = []
    for minute in range(int((NOW - 86400) // 60) * 60, int(NOW // 60) * 60 - 600, 60):
        for role, wid in (("gateway", None), ("decode", worker.pk)):
            count = 12 if minute % 120 else 7  # uneven weights
            rows.append(Rollup(ts=float(minute), deployment_id=deployment.pk, role=role, worker_id=wid,
                               metric=METRIC_IDS["qps"], avg=(minute % 977) / 100.0, min=0.0, max=10.0,
                               count=count))
    Rollup.objects.bulk_create(rows)
    _seed(deployment, [("decode", worker.pk)])  # the newest minutes, not rolled up yet
    start, end, step = NOW - 86400, NOW, 288.0
    for worker_scope, roles, named in ((None, ("gateway",), None), ("all", ("decode",), (worker.pk,))):
        _, expected = query_series(SeriesQuery(metric="qps", deployment_id=deployment.pk, role=None,
                                               worker=worker_scope, start=start, end=end, step=step), now=NOW)
        source, got = query_series(SeriesQuery(metric="qps", deployment_id=deployment.pk, role=roles,
                                               worker=named, start=start, end=end, step=step), now=NOW)
        if worker_scope is None:
            expected = [s for s in expected if s["role"] == "gateway"]
        assert source == "rollup" and _normalise(got) == _normalise(expected)
        assert len(got[0]["points"]) <= 301


def test_an_empty_scope_reads_nothing(deployment):
    for role, worker in ((("decode",), ()), ((), None)):
        assert query_series(SeriesQuery(metric="qps", deployment_id=deployment.pk, role=role, worker=worker,
                                        start=NOW - 60, end=NOW, step=5), now=NOW) == ("raw", [])
