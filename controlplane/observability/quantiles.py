"""Histogram quantiles and counter increases, as Prometheus computes them. Pure functions, no Django.

`histogram_quantile(q, buckets)` is Prometheus' `histogram_quantile(q, rate(x_bucket[w]))` applied to the bucket
increases over a window (rate and increase differ by the constant window length, which cancels out):
linear interpolation inside the bucket that holds rank q × total; a rank in the +Inf bucket returns the upper bound of
the highest finite bucket; no observation in the window → None ("no data", where Prometheus returns NaN).
Counter resets (a process restart) are handled as Prometheus' `increase` does: a value lower than its predecessor
means the counter restarted from 0, so the new value itself is the increase over that step.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

Buckets = Sequence[tuple[float, float]]  # (upper bound `le`, cumulative count), +Inf included


def counter_increase(values: Sequence[float]) -> float:
    """Increase of a counter over consecutive samples (oldest first), counting through resets."""
    total = 0.0
    for previous, current in zip(values, values[1:]):
        total += current - previous if current >= previous else current
    return total


def bucket_increases(snapshots: Sequence[Buckets]) -> list[tuple[float, float]]:
    """Per-bucket increase over consecutive snapshots of one histogram (oldest first).

    Buckets are matched by their upper bound; a bound missing from some snapshot (a changed bucket layout after a
    restart) is dropped, since its increase cannot be known.
    """
    if len(snapshots) < 2:
        return []
    series: dict[float, list[float]] = {}
    common = set.intersection(*(set(le for le, _ in snap) for snap in snapshots))
    for snap in snapshots:
        for le, count in snap:
            if le in common:
                series.setdefault(le, []).append(count)
    # A reset of the histogram resets every bucket at once: detect it on the +Inf (total) count, so that all
    # buckets take the same branch and the result stays cumulative.
    totals = series.get(math.inf)
    if totals is None:
        return []
    result = []
    for le in sorted(series):
        values = series[le]
        inc = 0.0
        for i in range(1, len(values)):
            reset = totals[i] < totals[i - 1]
            inc += values[i] if reset else max(values[i] - values[i - 1], 0.0)
        result.append((le, inc))
    return result


def aligned_bucket_increases(les: Sequence[float], snapshots: Sequence[Sequence[float]]) -> list[tuple[float, float]]:
    """bucket_increases for snapshots that share one bucket layout `les` (each a list of counts, in the order of
    `les`, +Inf among them): the same result, without matching bounds (a scrape state keeps one layout per ring)."""
    if len(snapshots) < 2 or math.inf not in les:
        return []
    total_at = list(les).index(math.inf)
    increases = [0.0] * len(les)
    for previous, current in zip(snapshots, snapshots[1:]):
        if current[total_at] < previous[total_at]:  # the histogram restarted: every bucket counts from 0
            increases = [inc + now for inc, now in zip(increases, current)]
        else:
            increases = [inc + now - before if now > before else inc
                         for inc, now, before in zip(increases, current, previous)]
    return sorted(zip(les, increases))


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile (0 ≤ q ≤ 1) of a histogram given as cumulative (le, count) pairs, +Inf included."""
    return histogram_quantiles((q,), buckets)[0]


def histogram_quantiles(qs: Sequence[float], buckets: Buckets) -> list[float | None]:
    """histogram_quantile of each of `qs`, the buckets ordered and made monotonic once for all of them (a scrape
    asks three quantiles of every histogram of every target)."""
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be within 0..1, not {q}")
    ordered = sorted(buckets)
    if len(ordered) < 2 or ordered[-1][0] != math.inf:
        return [None] * len(qs)
    # Cumulative counts must not decrease; floating-point sums of rates can make them wobble (Prometheus fixes
    # them the same way).
    counts = []
    running = 0.0
    for _, count in ordered:
        running = max(running, count)
        counts.append(running)
    total = counts[-1]
    if total <= 0:
        return [None] * len(qs)
    return [_quantile(q * total, ordered, counts) for q in qs]


def _quantile(rank: float, ordered: Buckets, counts: list[float]) -> float:
    index = next(i for i, count in enumerate(counts) if count >= rank)
    if index == len(ordered) - 1:
        return ordered[-2][0]
    upper = ordered[index][0]
    if index == 0 and upper <= 0:
        return upper
    lower = 0.0 if index == 0 else ordered[index - 1][0]
    below = 0.0 if index == 0 else counts[index - 1]
    in_bucket = counts[index] - below
    if in_bucket <= 0:
        return upper
    return lower + (upper - lower) * (rank - below) / in_bucket


def sum_buckets(histograms: Sequence[Buckets]) -> list[tuple[float, float]]:
    """Bucket-wise sum of several histograms with the same layout (`sum by (le)`); bounds not in all are dropped."""
    if not histograms:
        return []
    common = set.intersection(*(set(le for le, _ in h) for h in histograms))
    totals = dict.fromkeys(common, 0.0)
    for histogram in histograms:
        for le, count in histogram:
            if le in totals:
                totals[le] += count
    return sorted(totals.items())
