"""The hypothesis and abort decisions, one call each: a window is judged only when the gateway's scrapes cover it,
after a revert only on what followed it; lacking data never holds; an abort needs its breach held for `for_s`."""
from __future__ import annotations

from controlplane.chaos.hypothesis import abort_decision, gateway_window, judge_check, judge_hypothesis


def _sample(ts: float, ok: int, errors: int = 0, migrated: int = 0) -> dict:
    return {"ts": ts, "snapshot": {"c": {"success": ok, "errors": errors, "server_errors": errors,
                                         "migrations": migrated, "retries": 0}, "h": {}}}


SAMPLES = [_sample(100, 10), _sample(102, 20), _sample(104, 30, errors=5, migrated=2), _sample(106, 40, errors=5, migrated=2)]


def test_a_window_reads_the_increase_from_the_sample_at_its_start():
    numbers = gateway_window(SAMPLES, now=106, window_s=4)
    assert (numbers["requests"], numbers["errors"], numbers["migrated"]) == (25, 5, 2)
    assert numbers["error_ratio"] == 5 / 25 and numbers["span_s"] == 4


def test_a_window_longer_than_the_scrapes_is_not_covered():
    assert gateway_window(SAMPLES, now=106, window_s=10) is None
    assert gateway_window(SAMPLES[:1], now=100, window_s=1) is None


def test_after_a_revert_the_window_starts_at_the_revert():
    numbers = gateway_window(SAMPLES, now=106, window_s=30, since=103)
    assert (numbers["requests"], numbers["errors"]) == (10, 0)


def test_a_check_without_data_does_not_hold():
    assert judge_check({"metric": "error_ratio", "role": "gateway", "max": 0.01}, None)["holds"] is False


def test_a_baseline_ratio_check_compares_with_the_value_before_the_fault():
    check = {"metric": "ttft_p99_seconds", "role": "gateway", "max_baseline_ratio": 1.5}
    assert judge_check(check, 0.29, baseline=0.2)["holds"]
    failed = judge_check(check, 0.31, baseline=0.2)
    assert not failed["holds"] and "needs <= 0.3" in failed["why"]
    assert not judge_check(check, 0.1, baseline=None)["holds"]


def test_the_hypothesis_holds_only_when_every_check_holds():
    checks = [{"metric": "error_ratio", "role": "gateway", "max": 0.01},
              {"metric": "ready_workers", "role": "decode", "min": 2}]
    judged = judge_hypothesis(checks, [0.0, 1.0])
    assert not judged["holds"] and judged["failing"] == ["ready_workers (decode) is 1, needs >= 2"]
    assert judge_hypothesis(checks, [0.0, 2.0])["holds"]


def test_an_abort_waits_for_the_breach_to_last_for_s_and_forgets_a_breach_that_ended():
    conditions = [{"metric": "error_ratio", "role": "gateway", "above": 0.05, "for_s": 10}]
    breaches, reason = abort_decision(conditions, [0.2], {}, now=100)
    assert breaches == {"0": 100} and reason is None
    breaches, reason = abort_decision(conditions, [0.2], breaches, now=105)
    assert reason is None
    assert abort_decision(conditions, [0.01], breaches, now=108) == ({}, None)
    breaches, _ = abort_decision(conditions, [0.3], {}, now=120)
    _, reason = abort_decision(conditions, [0.3], breaches, now=130)
    assert reason == "abort condition 1: error_ratio (gateway) is 0.3, above 0.05 for 10 s"


def test_no_data_is_no_breach():
    conditions = [{"metric": "error_ratio", "role": "gateway", "above": 0.05, "for_s": 0}]
    assert abort_decision(conditions, [None], {}, now=1) == ({}, None)
