"""1-minute rollups of the raw samples and retention pruning, one pass at a time."""
import pytest
from django.test import override_settings

from controlplane.observability.catalog import METRIC_IDS
from controlplane.observability.models import GatewayCounters, RevisionSample, Rollup, Sample, ScrapeState
from controlplane.observability.rollup import prune, rollup_pending
from controlplane.observability.series import metric_values

MINUTE = 1_800_000_000 // 60 * 60  # a minute boundary
QPS = METRIC_IDS["qps"]


def add_samples(deployment_id, worker_id, values, start):
    Sample.objects.bulk_create([Sample(ts=start + 5 * i, deployment_id=deployment_id, role="decode",
                                       worker_id=worker_id, metric=QPS, value=v) for i, v in enumerate(values)])


@pytest.mark.django_db
def test_a_pass_rolls_up_each_complete_minute_once_per_series():
    add_samples(1, None, [1.0] * 12, MINUTE)  # minute 0: twelve 1.0
    add_samples(1, 7, [2.0, 4.0, 6.0], MINUTE + 60)  # minute 1: a worker's series
    add_samples(1, None, [9.0], MINUTE + 120)  # minute 2: not complete yet at "now"
    assert rollup_pending(now=MINUTE + 150) == 2
    pool = Rollup.objects.get(ts=MINUTE, worker_id=None)
    assert (pool.avg, pool.min, pool.max, pool.count) == (1.0, 1.0, 1.0, 12)
    worker = Rollup.objects.get(ts=MINUTE + 60, worker_id=7)
    assert (worker.avg, worker.min, worker.max, worker.count) == (4.0, 2.0, 6.0, 3)
    # Running again writes nothing twice; once minute 2 is complete it is rolled up.
    assert rollup_pending(now=MINUTE + 150) == 0
    assert rollup_pending(now=MINUTE + 200) == 1
    assert Rollup.objects.count() == 3


@pytest.mark.django_db
def test_a_gap_without_samples_is_skipped():
    add_samples(1, None, [1.0], MINUTE)
    rollup_pending(now=MINUTE + 100)
    later = MINUTE + 60 * 500  # longer than one pass may cover
    add_samples(1, None, [3.0], later)
    assert rollup_pending(now=later + 100) == 1
    assert Rollup.objects.filter(ts=later).exists()


@pytest.mark.django_db
@override_settings(TANDEM_METRICS_RAW_RETENTION_S=3600, TANDEM_METRICS_ROLLUP_RETENTION_S=86400)
def test_prune_deletes_what_is_past_retention():
    now = MINUTE + 2 * 86400
    add_samples(1, None, [1.0], now - 3700)  # past raw retention
    add_samples(1, None, [2.0], now - 60)
    Rollup.objects.create(ts=now - 90000, deployment_id=1, role="decode", metric=QPS, avg=1, min=1, max=1, count=1)
    Rollup.objects.create(ts=now - 600, deployment_id=1, role="decode", metric=QPS, avg=1, min=1, max=1, count=1)
    ScrapeState.objects.create(worker_id=5, deployment_id=1, role="decode", last_scrape_at=now - 4000)
    ScrapeState.objects.create(worker_id=6, deployment_id=1, role="decode", last_scrape_at=now - 5)
    # A gateway's per-revision series are kept as long as raw samples.
    RevisionSample.objects.create(ts=now - 3700, deployment_id=1, revision=1, metric=QPS, value=3.0)
    RevisionSample.objects.create(ts=now - 60, deployment_id=1, revision=2, metric=QPS, value=4.0)
    # So are a gateway's counters as scraped.
    GatewayCounters.objects.create(ts=now - 3700, deployment_id=1, worker_id=9)
    GatewayCounters.objects.create(ts=now - 60, deployment_id=1, worker_id=9)
    assert prune(now=now) == {"samples": 1, "revision_samples": 1, "tenant_samples": 0, "gateway_counters": 1,
                              "rollups": 1, "scrape_states": 1, "tenant_usage": 0}
    assert list(Sample.objects.values_list("value", flat=True)) == [2.0]
    assert list(RevisionSample.objects.values_list("value", flat=True)) == [4.0]
    assert list(GatewayCounters.objects.values_list("ts", flat=True)) == [now - 60]
    assert list(ScrapeState.objects.values_list("worker_id", flat=True)) == [6]


@pytest.mark.django_db
@override_settings(TANDEM_METRICS_RAW_RETENTION_S=3600)
def test_selectors_read_rollups_for_windows_older_than_raw_retention(deployment):
    start = MINUTE
    for minute, (avg, count) in enumerate([(1.0, 12), (4.0, 4)]):
        Rollup.objects.create(ts=start + 60 * minute, deployment_id=deployment.pk, role="decode", metric=QPS,
                              avg=avg, min=avg, max=avg * 2, count=count)
    now = start + 3 * 3600
    [value] = metric_values(metric="qps", deployment=deployment, role="decode", window_s=120,
                            offset_s=now - (start + 120), now=now)
    assert value.value == pytest.approx((12 * 1.0 + 4 * 4.0) / 16)  # weighted by samples per minute
    assert value.num_samples == 16
    [top] = metric_values(metric="qps", deployment=deployment, role="decode", aggregation="max", window_s=120,
                          offset_s=now - (start + 120), now=now)
    assert top.value == 8.0
