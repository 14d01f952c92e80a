"""Probes of a steady-state hypothesis: each reads one check of a Tandem experiment as Tandem judges it now
(GET .../chaos/experiments/{experiment}/steady-state), and its tolerance, a range, is the check's bound. A check
without data (no request in its window) fails the probe: lacking data never passes, as in a Tandem run."""
from __future__ import annotations

from chaoslib.exceptions import ActivityFailed

from tandem_chaostoolkit.client import call

__all__ = ["metric_value", "baseline_ratio"]


def _check(experiment: str, ratio: bool, wanted: dict, configuration, secrets) -> dict:
    state = call("GET", f"experiments/{experiment}/steady-state", configuration=configuration, secrets=secrets)
    for check in state["checks"]:
        if ("max_baseline_ratio" in check) == ratio \
                and all(check.get(key) == value for key, value in wanted.items() if value is not None):
            return check
    shown = ", ".join(f"{key}={value}" for key, value in wanted.items() if value is not None)
    raise ActivityFailed(f"the Tandem experiment {experiment!r} has no {'baseline ratio ' if ratio else ''}check "
                         f"of {shown}: it was changed since this file was exported; export it again")


def metric_value(experiment: str, metric: str, role: str | None = None, window_s: int | None = None,
                 aggregation: str | None = None, configuration: dict | None = None,
                 secrets: dict | None = None) -> float:
    """The value of the experiment's check of `metric` now (over its window ending now)."""
    check = _check(experiment, False, {"metric": metric, "role": role, "window_s": window_s,
                                       "aggregation": aggregation}, configuration, secrets)
    if check["value"] is None:
        raise ActivityFailed(check["why"] or f"{metric}: no data in the window")
    return check["value"]


def baseline_ratio(experiment: str, metric: str, role: str | None = None, window_s: int | None = None,
                   aggregation: str | None = None, configuration: dict | None = None,
                   secrets: dict | None = None) -> float:
    """The value of the experiment's `max_baseline_ratio` check of `metric` now, divided by its value before the
    faults of the experiment's current (or just finished) run; before a run, by its value now (1: steady)."""
    check = _check(experiment, True, {"metric": metric, "role": role, "window_s": window_s,
                                      "aggregation": aggregation}, configuration, secrets)
    if check["ratio"] is None:
        raise ActivityFailed(check["why"] or f"{metric}: no data in the window")
    return check["ratio"]
