"""GET /api/v1/metrics/query: roles, series from raw samples or rollups, downsampling, and clear 400s."""
import time

import pytest

from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import Rollup, Sample

URL = "/api/v1/metrics/query"


@pytest.fixture
def recent(deployment):
    """Two minutes of pool and per-worker qps at 5 s, ending now."""
    now = time.time()
    start = now - 120
    rows = []
    for i in range(24):
        ts = start + 5 * i
        rows.append(Sample(ts=ts, deployment_id=deployment.pk, role="decode", worker_id=None,
                           metric=METRIC_IDS["qps"], value=float(i)))
        for worker_id in (11, 12):
            rows.append(Sample(ts=ts, deployment_id=deployment.pk, role="decode", worker_id=worker_id,
                               metric=METRIC_IDS["qps"], value=float(worker_id)))
    Sample.objects.bulk_create(rows)
    return start, now


def test_a_viewer_reads_the_pool_series_downsampled_to_the_step(viewer_api, recent):
    start, now = recent
    response = viewer_api.get(URL, {"metric": "qps", "deployment": "demo", "role": "decode",
                                    "start": start, "end": start + 60, "step": 30})
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["source"], body["unit"], body["step"]) == ("raw", "requests/second", 30.0)
    [series] = body["series"]
    assert series["worker_id"] is None and series["role"] == "decode"
    # [start, start+30): samples 0..5 → mean 2.5; [start+30, start+60): 6..11 → 8.5
    assert series["points"] == [[start, 2.5], [start + 30, 8.5]]


def test_worker_all_gives_one_series_per_worker_and_an_id_gives_one(viewer_api, recent):
    start, _ = recent
    body = viewer_api.get(URL, {"metric": "qps", "deployment": "demo", "worker": "all", "start": start,
                                "step": 60}).json()
    assert [s["worker_id"] for s in body["series"]] == [11, 12]
    assert body["series"][0]["points"][0][1] == 11.0
    body = viewer_api.get(URL, {"metric": "qps", "deployment": "demo", "worker": "12", "start": start}).json()
    assert [s["worker_id"] for s in body["series"]] == [12]


def test_a_long_range_reads_the_rollups(viewer_api, deployment):
    now = time.time()
    minute = int(now // 60 * 60) - 86400
    Rollup.objects.bulk_create([Rollup(ts=minute + 60 * i, deployment_id=deployment.pk, role="decode",
                                       metric=METRIC_IDS["qps"], avg=float(i % 2), min=0, max=1, count=12)
                                for i in range(10)])
    body = viewer_api.get(URL, {"metric": "qps", "deployment": "demo", "role": "decode",
                                "start": minute - 3600 * 23, "end": now, "step": 600}).json()
    assert body["source"] == "rollup"
    [series] = body["series"]
    assert [round(v, 3) for _, v in series["points"]] == [0.5]  # ten minutes of alternating 0 and 1


def test_anonymous_and_outsiders_are_refused(anon_api, outsider_api, recent):
    assert anon_api.get(URL, {"metric": "qps", "deployment": "demo"}).status_code == 401
    assert outsider_api.get(URL, {"metric": "qps", "deployment": "demo"}).status_code == 403


@pytest.mark.parametrize("params, field, words", [
    ({"deployment": "demo"}, "metric", "metric is required"),
    ({"metric": "qpss", "deployment": "demo"}, "metric", "unknown metric 'qpss'"),
    ({"metric": "qps"}, "deployment", "deployment is required"),
    ({"metric": "qps", "deployment": "demo", "role": "chef"}, "role", "role 'chef' is not one of"),
    ({"metric": "qps", "deployment": "demo", "start": "yesterday"}, "start", "neither Unix seconds nor"),
    ({"metric": "qps", "deployment": "demo", "start": "2000", "end": "1000"}, "start", "must be before end"),
    ({"metric": "qps", "deployment": "demo", "step": "0"}, "step", "at least 1 second"),
    ({"metric": "qps", "deployment": "demo", "step": "fast"}, "step", "not a number"),
    ({"metric": "qps", "deployment": "demo", "start": "0", "end": "1000000"}, "end", "oldest kept data"),
    ({"metric": "qps", "deployment": "demo", "worker": "x"}, "worker", "worker id or 'all'"),
])
def test_bad_input_answers_400_saying_what_is_wrong(viewer_api, deployment, params, field, words):
    response = viewer_api.get(URL, params)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field and words in error["message"]


def test_too_many_points_and_unknown_deployments_are_refused(viewer_api, deployment):
    now = time.time()
    response = viewer_api.get(URL, {"metric": "qps", "deployment": "demo", "start": now - 86400, "end": now,
                                    "step": "1"})
    assert response.status_code == 400 and "exceed the limit" in response.json()["error"]["message"]
    response = viewer_api.get(URL, {"metric": "qps", "deployment": "nope"})
    assert response.status_code == 404 and "'nope' does not exist" in response.json()["error"]["message"]


def test_iso_times_are_accepted_with_a_zone_or_as_utc(viewer_api, recent):
    from datetime import datetime, timezone

    start, now = recent
    iso = datetime.fromtimestamp(start, tz=timezone.utc)
    for value in (iso.isoformat(), iso.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), iso.strftime("%Y-%m-%d %H:%M:%S.%f"),
                  iso.isoformat().replace("+", " ")):  # an unencoded '+' of the offset arrives as a space
        body = viewer_api.get(URL, {"metric": "qps", "deployment": "demo", "start": value, "end": now}).json()
        assert body["start"] == pytest.approx(start, abs=1e-3), value


@pytest.mark.parametrize("params, field, words", [
    ({"worker": "²"}, "worker", "worker id or 'all'"),  # str.isdigit() is true for it, int() refuses it
    ({"start": "2026-13-01T00:00:00"}, "start", "neither Unix seconds nor"),  # well formed, no such month
    ({"end": "2026-02-30T12:00:00Z"}, "end", "neither Unix seconds nor"),
    ({"end": "1e300"}, "end", "between 1970 and year 9999"),
    ({"start": "1969-12-31T00:00:00Z"}, "start", "between 1970 and year 9999"),
])
def test_odd_digits_impossible_dates_and_absurd_times_answer_400_not_500(viewer_api, deployment, params, field,
                                                                         words):
    response = viewer_api.get(URL, {"metric": "qps", "deployment": "demo", **params})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field and words in error["message"], error


def test_a_deployment_name_with_a_nul_is_404_without_a_query(viewer_api, deployment):
    # PostgreSQL refuses a NUL in a text parameter: the look-up must not reach the database (SQLite would answer).
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        response = viewer_api.get(URL, {"metric": "qps", "deployment": "de\x00mo"})
    assert response.status_code == 404, response.content
    assert not [q["sql"] for q in queries.captured_queries if "controlplane_deployment" in q["sql"]]
