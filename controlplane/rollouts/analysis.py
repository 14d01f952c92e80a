"""Compare the tried revision with stable over one window, from the gateway's per-revision counters and histograms
(the numbers as clients see them). Pure functions on JSON snapshots, no Django, so verdicts are tested one call at a
time.

A snapshot is the gateway's cumulative request metrics of one revision at one moment:
    {"c": {"success", "errors", "server_errors", "generation_tokens", ...}, "h": {"ttft": [[le, count], ...], ...}}
with the +Inf bound as the string "+Inf" (JSON has no infinity). The numbers of a window are the increases from the
window's first snapshot (AnalysisRun.baseline) to the latest, so both revisions are read over the same window.

Significance (A/B report): a two-proportion z-test on the error ratios, and Pearson's chi-square test of homogeneity
on the bucket counts of each latency histogram (the histograms are all the gateway keeps of each request's latency,
so a rank test such as Mann-Whitney U on individual samples is not available; buckets with fewer than 5 expected
requests are merged into their neighbour, as the test requires).
"""
from __future__ import annotations

import math

from controlplane.observability.catalog import HISTOGRAMS
from controlplane.observability.exposition import Reading
from controlplane.observability.quantiles import bucket_increases, counter_increase, histogram_quantile

# The comparisons a canary analysis runs, with their defaults: latency P99s at most `max_latency_ratio` times
# stable's; error and 5xx ratios at most stable's plus `max_error_ratio_increase` (0.005: half a percentage point);
# nothing judged before each side served `min_requests` in the window; evaluated every `interval_s`; a step whose time
# is up and that still lacks those requests `max_wait_s` later aborts (0: waits for ever): whatever keeps traffic
# off the canary (no client, a gateway that cannot reach it) would otherwise hold the rollout, and every change queued
# behind it, without a word.
DEFAULT_CONDITIONS = {
    "min_requests": 20,
    "max_latency_ratio": 1.2,
    "max_error_ratio_increase": 0.005,
    "interval_s": 5,
    "max_wait_s": 3600,
}
# Latency P99s below this many seconds on both sides are equal for the ratio test: a 2 ms vs 3 ms ITL is noise, not
# a regression by half.
LATENCY_FLOOR_S = 0.005
# How unlikely by chance a latency difference must be before it fails a canary (judge).
DEFAULT_LATENCY_ALPHA = 0.01
LATENCY_METRICS = {key: f"{key}_p99_seconds" for key in HISTOGRAMS}  # ttft, itl, e2e
RATIO_METRICS = ("error_ratio", "server_error_ratio")


def snapshot_of(reading: Reading | None) -> dict:
    """A Reading (one revision's part of the gateway's /metrics) as a JSON snapshot."""
    if reading is None:
        return {"c": {}, "h": {}}
    return {"c": dict(reading.counters),
            "h": {key: [["+Inf" if math.isinf(le) else le, count] for le, count in buckets]
                  for key, buckets in reading.histograms.items()}}


def _buckets(snapshot: dict, key: str) -> list[tuple[float, float]]:
    return [(math.inf if le == "+Inf" else float(le), float(count)) for le, count in snapshot.get("h", {}).get(key, [])]


def window_numbers(start: dict, end: dict) -> dict:
    """The numbers of one revision over the window from snapshot `start` to snapshot `end`.

    requests, errors, server_errors (counts); error_ratio, server_error_ratio; ttft/itl/e2e P99 (seconds, None
    without a request); tokens_per_request (generated tokens per successful request); buckets: the per-bucket
    increases of each latency histogram (for the significance test and the report)."""
    counters = {key: counter_increase([start.get("c", {}).get(key, 0.0), value])
                for key, value in end.get("c", {}).items()}
    success, errors = counters.get("success", 0.0), counters.get("errors", 0.0)
    requests = success + errors
    numbers: dict = {
        "requests": int(round(requests)),
        "errors": int(round(errors)),
        "server_errors": int(round(counters.get("server_errors", 0.0))),
        "error_ratio": errors / requests if requests else None,
        "server_error_ratio": counters.get("server_errors", 0.0) / requests if requests else None,
        "tokens_per_request": counters["generation_tokens"] / success if success and "generation_tokens" in counters
        else None,
        "buckets": {},
    }
    for key, metric in LATENCY_METRICS.items():
        after = _buckets(end, key)
        before = _buckets(start, key) or [(le, 0.0) for le, _ in after]
        increases = bucket_increases([before, after]) if after else []
        numbers[metric] = histogram_quantile(0.99, increases) if increases else None
        numbers["buckets"][key] = [["+Inf" if math.isinf(le) else le, count] for le, count in increases]
    return numbers


def judge(stable: dict, canary: dict, conditions: dict) -> tuple[str, list[dict], str]:
    """("waiting" | "passing" | "failed", failures, note). Waiting until both sides served min_requests in the
    window: lacking data never passes. Each failure names the metric, both values and the limit. `note` says what a
    waiting verdict waits for.

    A latency P99 over its limit fails the canary only where the two latency histograms differ beyond chance
    (the chi-square test of `chi_square_buckets`, p below `latency_alpha`, default 0.01): with a few requests a P99
    is the single slowest one, and one slow request of an identical revision is noise, not a regression. While
    there are too few requests for the test to say, the verdict waits for more (as Kayenta's Mann-Whitney does)."""
    needed = conditions["min_requests"]
    if stable["requests"] < needed or canary["requests"] < needed:
        return "waiting", [], (f"waiting: stable {stable['requests']} of {needed} requests, canary "
                               f"{canary['requests']} of {needed}")
    alpha = conditions.get("latency_alpha", DEFAULT_LATENCY_ALPHA)
    failures, undecided = [], []
    for key, metric in LATENCY_METRICS.items():
        base, tried = stable.get(metric), canary.get(metric)
        if tried is None:
            continue
        if base is None:
            # Stable served requests but has no latency of this kind (a stage it does not time): nothing to compare.
            continue
        limit = max(base, LATENCY_FLOOR_S) * conditions["max_latency_ratio"]
        if tried <= limit:
            continue
        test = chi_square_buckets(stable.get("buckets", {}).get(key, []), canary.get("buckets", {}).get(key, []))
        if test.get("p_value") is None:
            undecided.append(f"{metric} {tried:.4g} vs {base:.4g} s: too few requests to tell it from chance")
        elif test["p_value"] < alpha:
            failures.append({"metric": metric, "stable": base, "canary": tried, "limit": limit,
                             "p_value": test["p_value"],
                             "condition": f"canary P99 at most {conditions['max_latency_ratio']}x stable "
                                          f"(the histograms differ: p {test['p_value']:.2g} < {alpha})"})
    for metric in RATIO_METRICS:
        base, tried = stable.get(metric) or 0.0, canary.get(metric) or 0.0
        limit = base + conditions["max_error_ratio_increase"]
        if tried > limit:
            failures.append({"metric": metric, "stable": base, "canary": tried, "limit": limit,
                             "condition": f"canary at most stable + {conditions['max_error_ratio_increase']}"})
    if failures:
        return "failed", failures, ""
    if undecided:
        return "waiting", [], "waiting for more requests: " + "; ".join(undecided)
    return "passing", [], ""


# --- significance (A/B report) ------------------------------------------------------------------------------------

def two_proportion_z(errors_a: int, n_a: int, errors_b: int, n_b: int) -> dict:
    """Two-sided two-proportion z-test (pooled variance) on error ratios."""
    if n_a == 0 or n_b == 0:
        return {"test": "two-proportion z-test", "p_value": None, "note": "no requests on one side"}
    pooled = (errors_a + errors_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    if se == 0:
        return {"test": "two-proportion z-test", "z": 0.0, "p_value": 1.0,
                "note": "identical error ratios (both 0 or both 1)"}
    z = (errors_a / n_a - errors_b / n_b) / se
    return {"test": "two-proportion z-test", "z": z, "p_value": math.erfc(abs(z) / math.sqrt(2))}


def _gamma_q(a: float, x: float) -> float:
    """The regularized upper incomplete gamma function Q(a, x) (series for x < a + 1, else a continued fraction,
    as in Numerical Recipes' gammq): the chi-square survival function is Q(k / 2, x / 2)."""
    if x <= 0:
        return 1.0
    log_prefix = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(500):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-12:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefix))
    b, c, d = x + 1 - a, 1e300, 1.0 / (x + 1 - a)
    h = d
    for i in range(1, 500):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-12:
            break
    return min(1.0, math.exp(log_prefix) * h)


def chi_square_buckets(cumulative_a: list, cumulative_b: list) -> dict:
    """Pearson's chi-square test of homogeneity on two latency histograms (cumulative [le, count] pairs of the same
    layout): do both revisions spread their requests over the buckets alike?"""
    def per_bucket(cumulative):
        counts, previous = [], 0.0
        for _, count in cumulative:
            counts.append(max(count - previous, 0.0))
            previous = count
        return counts

    a, b = per_bucket(cumulative_a), per_bucket(cumulative_b)
    result = {"test": "chi-square test of homogeneity on histogram buckets", "p_value": None}
    if len(a) != len(b) or not a or sum(a) == 0 or sum(b) == 0:
        result["note"] = "no requests on one side"
        return result
    total_a, total_b = sum(a), sum(b)
    share_a = total_a / (total_a + total_b)
    # Merge neighbouring buckets until each column expects at least 5 requests on both sides.
    columns, col_a, col_b = [], 0.0, 0.0
    for count_a, count_b in zip(a, b):
        col_a, col_b = col_a + count_a, col_b + count_b
        column = col_a + col_b
        if column * share_a >= 5 and column * (1 - share_a) >= 5:
            columns.append((col_a, col_b))
            col_a = col_b = 0.0
    if col_a or col_b:
        if columns:
            last_a, last_b = columns.pop()
            columns.append((last_a + col_a, last_b + col_b))
        else:
            columns.append((col_a, col_b))
    if len(columns) < 2:
        result["note"] = "too few requests to compare the distributions (fewer than 5 expected per bucket)"
        return result
    statistic = 0.0
    for col_a, col_b in columns:
        column = col_a + col_b
        for observed, share in ((col_a, share_a), (col_b, 1 - share_a)):
            expected = column * share
            statistic += (observed - expected) ** 2 / expected
    dof = len(columns) - 1
    result.update(statistic=statistic, dof=dof, p_value=_gamma_q(dof / 2, statistic / 2))
    return result


def significance(a: dict, b: dict, *, alpha: float = 0.05) -> dict:
    """The A/B report's significance note: each test with its p-value, and a sentence."""
    tests = {"error_ratio": two_proportion_z(a["errors"], a["requests"], b["errors"], b["requests"])}
    for key in LATENCY_METRICS:
        tests[f"{key}_distribution"] = chi_square_buckets(a["buckets"].get(key, []), b["buckets"].get(key, []))
    differing = [name for name, test in tests.items() if test.get("p_value") is not None and test["p_value"] < alpha]
    note = (f"at alpha {alpha}: " + (f"a significant difference in {', '.join(differing)}" if differing
                                     else "no significant difference found"))
    return {"alpha": alpha, "tests": tests, "note": note}
