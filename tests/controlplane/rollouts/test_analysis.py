"""Canary verdicts and the A/B significance note, one call at a time on JSON snapshots."""
from __future__ import annotations

import math

from controlplane.observability.exposition import parse_exposition
from controlplane.rollouts.analysis import (DEFAULT_CONDITIONS, chi_square_buckets, judge, significance,
                                            snapshot_of, two_proportion_z, window_numbers)
from tests.controlplane.rollouts.conftest import exposition


def _numbers(start: dict, end: dict, revision: int = 1) -> dict:
    before = snapshot_of(parse_exposition(exposition({revision: start})).by_revision[str(revision)])
    after = snapshot_of(parse_exposition(exposition({revision: end})).by_revision[str(revision)])
    return window_numbers(before, after)


def test_the_window_counts_only_what_happened_after_its_start():
    numbers = _numbers({"ok": 100, "errors": 5, "tokens": 800}, {"ok": 130, "errors": 5, "tokens": 1040})
    assert numbers["requests"] == 30 and numbers["errors"] == 0
    assert numbers["error_ratio"] == 0.0 and numbers["tokens_per_request"] == 8.0
    assert numbers["ttft_p99_seconds"] is not None and numbers["ttft_p99_seconds"] <= 0.05


def test_it_waits_below_min_requests_and_never_passes_without_data():
    stable = _numbers({}, {"ok": 100})
    canary = _numbers({}, {"ok": 5})
    assert judge(stable, canary, DEFAULT_CONDITIONS) == ("waiting", [], "waiting: stable 100 of 20 requests, "
                                                                        "canary 5 of 20")
    empty = _numbers({}, {})
    assert judge(empty, empty, DEFAULT_CONDITIONS)[0] == "waiting"


def test_a_canary_within_the_conditions_is_passing():
    stable = _numbers({}, {"ok": 50, "ttft": 0.3})
    canary = _numbers({}, {"ok": 25, "ttft": 0.3})
    assert judge(stable, canary, DEFAULT_CONDITIONS) == ("passing", [], "")


def test_a_slower_canary_fails_with_both_numbers_and_the_limit():
    stable = _numbers({}, {"ok": 50, "e2e": 0.3})
    canary = _numbers({}, {"ok": 25, "e2e": 3.0})
    verdict, failures, _ = judge(stable, canary, DEFAULT_CONDITIONS)
    assert verdict == "failed"
    failure = next(f for f in failures if f["metric"] == "e2e_p99_seconds")
    assert failure["canary"] > failure["limit"] >= failure["stable"]


def test_an_erroring_canary_fails_on_error_and_5xx_ratio():
    stable = _numbers({}, {"ok": 100})
    canary = _numbers({}, {"ok": 0, "errors": 30})
    verdict, failures, _ = judge(stable, canary, DEFAULT_CONDITIONS)
    assert verdict == "failed"
    assert {"error_ratio", "server_error_ratio"} <= {f["metric"] for f in failures}


def test_the_error_ratio_allows_half_a_point_above_stable():
    stable = _numbers({}, {"ok": 990, "errors": 10})  # 1.0 %
    within = _numbers({}, {"ok": 986, "errors": 14})  # 1.4 %
    beyond = _numbers({}, {"ok": 980, "errors": 20})  # 2.0 %
    assert judge(stable, within, DEFAULT_CONDITIONS)[0] == "passing"
    assert judge(stable, beyond, DEFAULT_CONDITIONS)[0] == "failed"


def test_one_slow_request_of_a_few_is_no_regression_until_the_histograms_differ_beyond_chance():
    """A P99 of 7 requests is the slowest one: on its own it waits for more requests, naming what it waits for;
    a real shift of the whole distribution fails."""
    stable = _numbers({}, {"ok": 200, "itl": 0.03})
    one_slow = _numbers({}, {"ok": 20, "itl": 0.03}), _numbers({}, {"ok": 1, "itl": 0.5})
    canary = {**one_slow[0], "requests": 21, "itl_p99_seconds": 0.5,
              "buckets": {**one_slow[0]["buckets"], "itl": _merged(one_slow[0], one_slow[1], "itl")}}
    verdict, failures, note = judge(stable, canary, {**DEFAULT_CONDITIONS, "min_requests": 7})
    assert (verdict, failures) == ("waiting", []) and "too few requests to tell it from chance" in note
    shifted = _numbers({}, {"ok": 60, "itl": 0.5})
    verdict, failures, _ = judge(stable, shifted, {**DEFAULT_CONDITIONS, "min_requests": 7})
    assert verdict == "failed" and any(f["metric"] == "itl_p99_seconds" and f["p_value"] < 0.01 for f in failures)


def _merged(a: dict, b: dict, key: str) -> list:
    """The cumulative buckets of two windows' requests together."""
    return [[le, count_a + count_b] for (le, count_a), (_, count_b) in zip(a["buckets"][key], b["buckets"][key])]


def test_the_two_proportion_z_test_tells_a_real_difference_from_noise():
    assert two_proportion_z(50, 1000, 5, 1000)["p_value"] < 0.001
    assert two_proportion_z(10, 1000, 11, 1000)["p_value"] > 0.5
    assert two_proportion_z(0, 100, 0, 100)["p_value"] == 1.0


def test_the_chi_square_test_compares_bucket_distributions():
    same = chi_square_buckets([[0.1, 50], [1.0, 90], ["+Inf", 100]], [[0.1, 52], [1.0, 91], ["+Inf", 100]])
    shifted = chi_square_buckets([[0.1, 80], [1.0, 95], ["+Inf", 100]], [[0.1, 10], [1.0, 60], ["+Inf", 100]])
    assert same["p_value"] > 0.5 and shifted["p_value"] < 1e-6
    assert chi_square_buckets([], [])["p_value"] is None


def test_the_significance_note_names_what_differs():
    a = _numbers({}, {"ok": 200, "e2e": 0.3})
    b = _numbers({}, {"ok": 200, "e2e": 3.0})
    note = significance(a, b)
    assert note["tests"]["e2e_distribution"]["p_value"] < 0.05 and "e2e_distribution" in note["note"]
    assert not math.isnan(note["tests"]["error_ratio"]["p_value"])
