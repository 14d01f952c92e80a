"""The steady-state hypothesis and the abort conditions, judged on values already read. Pure functions, no Django,
so each decision is tested in one call.

Gateway numbers over a window come from two scrapes of the gateway's cumulative counters (observability's
gateway_counters, read through the metrics backend's reader), as a canary analysis reads them
(rollouts.analysis.window_numbers): the increases from the scrape at the window's start to the newest one, exact over
the span between them in either backend. A window is `covered` only when a scrape exists at (or before) its start:
the numbers of a shorter span are not the window's. After the faults are reverted the window starts no earlier than
the revert (`since`), so a recovery is never judged on requests that the fault slowed.
"""
from __future__ import annotations

from controlplane.rollouts.analysis import LATENCY_FLOOR_S, window_numbers


def _counter(start: dict, end: dict, key: str) -> float:
    before, after = float(start.get(key, 0.0)), float(end.get(key, 0.0))
    return after - before if after >= before else after  # a gateway restart resets its counters


def scrape_numbers(first: dict, last: dict) -> dict:
    """The gateway's numbers between two of its scrapes (each {"ts", "snapshot"}): requests, errors, server_errors,
    their ratios and the latency P99s (window_numbers), requests migrated and retried, and the span in seconds."""
    numbers = window_numbers(first["snapshot"], last["snapshot"])
    numbers.pop("buckets", None)
    counters = (first["snapshot"].get("c", {}), last["snapshot"].get("c", {}))
    numbers["migrated"] = int(round(_counter(*counters, "migrations")))
    numbers["retried"] = int(round(_counter(*counters, "retries")))
    numbers["span_s"] = round(last["ts"] - first["ts"], 3)
    return numbers


def gateway_window(scrapes: list[dict], *, now: float, window_s: float, since: float | None = None) -> dict | None:
    """The gateway's numbers over (now - window_s, now], or over (since, now] when `since` is later; None when the
    scrapes (oldest first, each {"ts", "snapshot"}) do not cover it.

    Without `since`: from the newest scrape at or before the window's start. With `since` inside the window: from
    the first scrape at or after `since` (the counters as they were when the faults ended)."""
    if not scrapes:
        return None
    start = now - window_s
    newest = scrapes[-1]
    if since is not None and since > start:
        first = next((s for s in scrapes if s["ts"] >= since), None)
    else:
        first = next((s for s in reversed(scrapes) if s["ts"] <= start), None)
    if first is None or first is newest:
        return None
    return scrape_numbers(first, newest)


def judge_check(check: dict, value: float | None, baseline: float | None = None) -> dict:
    """One hypothesis check: {"holds", "value", "limit", "why"}. A check without a value (no requests in the
    window, a window not covered yet, no sample of a series) does not hold: lacking data never passes."""
    if "max_baseline_ratio" in check:
        if baseline is None:
            return {"holds": False, "value": value, "limit": None,
                    "why": f"{check['metric']} had no value before the fault to compare with"}
        limit = max(baseline, LATENCY_FLOOR_S) * check["max_baseline_ratio"]
        op = "<="
    elif "max" in check:
        limit, op = check["max"], "<="
    else:
        limit, op = check["min"], ">="
    if value is None:
        return {"holds": False, "value": None, "limit": limit, "why": f"{check['metric']}: no data in the window"}
    holds = value <= limit if op == "<=" else value >= limit
    why = "" if holds else f"{check['metric']} ({check['role']}) is {value:.4g}, needs {op} {limit:.4g}"
    return {"holds": holds, "value": value, "limit": limit, "why": why}


def judge_hypothesis(checks: list[dict], values: list[float | None],
                     baselines: list[float | None] | None = None) -> dict:
    """{"holds": all checks hold, "checks": [each judge_check], "failing": [the why of each that does not]}."""
    baselines = baselines or [None] * len(checks)
    results = [judge_check(check, value, baseline) for check, value, baseline in zip(checks, values, baselines)]
    return {"holds": all(r["holds"] for r in results), "checks": results,
            "failing": [r["why"] for r in results if not r["holds"]]}


def is_breached(condition: dict, value: float | None) -> bool:
    """An abort condition's bound crossed by `value`; no value is no breach (an abort needs evidence)."""
    if value is None:
        return False
    return value > condition["above"] if "above" in condition else value < condition["below"]


def abort_decision(conditions: list[dict], values: list[float | None], breaches: dict[str, float],
                   now: float) -> tuple[dict[str, float], str | None]:
    """(the breaches still running, each since when; the reason to abort now, or None).

    A condition aborts once it has been breached at every pass for `for_s` (0: at the first breached pass); a pass
    that finds it within bounds forgets its breach."""
    running: dict[str, float] = {}
    reason = None
    for index, (condition, value) in enumerate(zip(conditions, values)):
        if not is_breached(condition, value):
            continue
        since = breaches.get(str(index), now)
        running[str(index)] = since
        if reason is None and now - since >= condition["for_s"]:
            bound = "above" if "above" in condition else "below"
            reason = (f"abort condition {index + 1}: {condition['metric']} ({condition['role']}) is {value:.4g}, "
                      f"{bound} {condition[bound]:g}" + (f" for {now - since:.0f} s" if condition["for_s"] else ""))
    return running, reason
