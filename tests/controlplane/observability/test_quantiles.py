"""Quantile math against hand-computed histograms (Prometheus' histogram_quantile over bucket increases)."""
import math

import pytest

from controlplane.observability.quantiles import (
    aligned_bucket_increases, bucket_increases, counter_increase, histogram_quantile, sum_buckets,
)

INF = math.inf
# 10 observations ≤ 0.1, 20 in (0.1, 0.5], 10 in (0.5, 1], 10 above 1.
HIST = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 50.0)]


@pytest.mark.parametrize("q, expected", [
    (0.1, 0.05),   # rank 5 in the first bucket: 0 + 0.1 × 5/10
    (0.5, 0.4),    # rank 25: 0.1 + 0.4 × (25 − 10)/20
    (0.7, 0.75),   # rank 35: 0.5 + 0.5 × (35 − 30)/10
    (0.8, 1.0),    # rank 40: exactly the top of the (0.5, 1] bucket
])
def test_it_interpolates_linearly_inside_the_bucket_holding_the_rank(q, expected):
    assert histogram_quantile(q, HIST) == pytest.approx(expected)


def test_a_rank_in_the_inf_bucket_returns_the_highest_finite_upper_bound():
    assert histogram_quantile(0.9, HIST) == 1.0  # rank 45 lies above 40, in (1, +Inf]
    assert histogram_quantile(0.99, HIST) == 1.0


def test_it_returns_none_without_observations_or_without_an_inf_bucket():
    assert histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(0.5, [(0.1, 3.0), (1.0, 5.0)]) is None
    assert histogram_quantile(0.5, []) is None


def test_it_refuses_a_quantile_outside_zero_to_one():
    with pytest.raises(ValueError, match="within 0..1"):
        histogram_quantile(1.5, HIST)


def test_the_order_of_buckets_does_not_matter():
    assert histogram_quantile(0.5, list(reversed(HIST))) == pytest.approx(0.4)


def test_counter_increase_counts_through_a_reset():
    # 5 → 8 (+3), restart → 2 (+2: it counted from 0), → 6 (+4)
    assert counter_increase([5.0, 8.0, 2.0, 6.0]) == 9.0
    assert counter_increase([7.0]) == 0.0


def test_bucket_increases_count_through_a_histogram_reset():
    s1 = [(0.1, 5.0), (1.0, 8.0), (INF, 10.0)]
    s2 = [(0.1, 7.0), (1.0, 12.0), (INF, 15.0)]  # +2, +4, +5
    s3 = [(0.1, 1.0), (1.0, 2.0), (INF, 3.0)]    # restarted: +1, +2, +3
    assert bucket_increases([s1, s2, s3]) == [(0.1, 3.0), (1.0, 6.0), (INF, 8.0)]
    # p50 of the window: rank 4 in (0.1, 1]: 0.1 + 0.9 × (4 − 3)/3
    assert histogram_quantile(0.5, bucket_increases([s1, s2, s3])) == pytest.approx(0.4)


def test_a_reset_is_seen_on_the_total_even_when_a_bucket_grew_past_its_old_count():
    # After the restart the 0.1 bucket holds 9 (> 7 before): per-bucket reset detection would count +2 and break
    # the cumulative shape; the total count (11 < 15) says every bucket restarted.
    s2 = [(0.1, 7.0), (1.0, 12.0), (INF, 15.0)]
    s3 = [(0.1, 9.0), (1.0, 10.0), (INF, 11.0)]
    assert bucket_increases([s2, s3]) == [(0.1, 9.0), (1.0, 10.0), (INF, 11.0)]


def test_bucket_increases_need_two_snapshots_and_drop_bounds_missing_from_one():
    assert bucket_increases([HIST]) == []
    old = [(0.1, 1.0), (0.2, 2.0), (INF, 3.0)]
    new = [(0.1, 2.0), (INF, 5.0)]
    assert bucket_increases([old, new]) == [(0.1, 1.0), (INF, 2.0)]


def test_sum_buckets_adds_workers_bucket_by_bucket():
    a = [(0.1, 1.0), (INF, 2.0)]
    b = [(0.1, 3.0), (INF, 7.0)]
    assert sum_buckets([a, b]) == [(0.1, 4.0), (INF, 9.0)]
    # the pool's median: rank 4.5 in (0.1, +Inf] → the highest finite bound
    assert histogram_quantile(0.5, sum_buckets([a, b])) == 0.1


def test_the_aligned_increases_equal_the_matched_ones_through_resets():
    """The scrape's fast path (one bucket layout per ring) gives bucket_increases' result on rings with growth,
    flat steps and restarts, for a thousand random rings."""
    import random

    rng = random.Random(7)
    les = [0.01, 0.1, 0.5, 1.0, INF]
    for _ in range(1000):
        ring, counts = [], [0.0] * len(les)
        for _ in range(rng.randint(1, 7)):
            if rng.random() < 0.15:
                counts = [0.0] * len(les)  # a restart
            new = [rng.randint(0, 3) for _ in les]
            running = 0.0
            counts = [c + (running := running + n) for c, n in zip(counts, new)]  # cumulative buckets
            ring.append(list(counts))
        matched = bucket_increases([list(zip(les, snap)) for snap in ring])
        aligned = aligned_bucket_increases(les, ring)
        assert [le for le, _ in aligned] == [le for le, _ in matched]
        assert [inc for _, inc in aligned] == pytest.approx([inc for _, inc in matched])
