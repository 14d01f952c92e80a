"""Checks of a rollout request: steps, the A/B split and the analysis conditions; each 400 names its field."""
from __future__ import annotations

from controlplane.errors import invalid
from controlplane.rollouts.analysis import DEFAULT_CONDITIONS
from controlplane.rollouts.models import Strategy
from controlplane.services.validation import each_object
from inference.checks import is_number

MAX_STEPS = 20
MAX_STEP_S = 7 * 24 * 3600
# 10% for 5 minutes, 50% for 10 minutes, each analysed; after the last step the canary is promoted (100%).
DEFAULT_CANARY_STEPS = [{"weight": 10, "duration_s": 300, "analysis": True},
                        {"weight": 50, "duration_s": 600, "analysis": True}]
_STEP_KEYS = ("weight", "duration_s", "analysis")
# key -> (minimum, maximum, integer?)
_CONDITIONS = {
    "min_requests": (1, 1_000_000, True),
    "max_latency_ratio": (1.0, 100.0, False),
    "max_error_ratio_increase": (0.0, 1.0, False),
    "interval_s": (1, 3600, True),
    "max_wait_s": (0, MAX_STEP_S, True),
    "latency_alpha": (0.0001, 0.5, False),
}


def _number(value, *, field: str, low, high, integer: bool):
    if isinstance(value, bool) or not is_number(value) or (integer and not float(value).is_integer()) \
            or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise invalid(f"{field} must be {kind} in {low}..{high}, not {value!r}", field=field)
    return int(value) if integer else float(value)


def validate_strategy(strategy) -> str:
    if strategy not in Strategy.values:
        raise invalid(f"strategy {strategy!r} is not one of {', '.join(Strategy.values)}", field="strategy")
    return strategy


def validate_steps(steps) -> list[dict]:
    """Canary steps: 1..20 objects {weight: 0..100, duration_s: 1..604800, analysis: bool (default true)}."""
    if steps is None:
        return [dict(step) for step in DEFAULT_CANARY_STEPS]
    if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_STEPS:
        raise invalid(f"steps must be a list of 1 to {MAX_STEPS} steps", field="steps")
    cleaned = []
    for where, step in each_object(steps, field="steps"):
        unknown = sorted(set(step) - set(_STEP_KEYS))
        if unknown:
            raise invalid(f"{where}.{unknown[0]} is not a step field; a step has {', '.join(_STEP_KEYS)}",
                          field=f"{where}.{unknown[0]}")
        for key in ("weight", "duration_s"):
            if key not in step:
                raise invalid(f"{where}.{key} is required", field=f"{where}.{key}")
        analysis = step.get("analysis", True)
        if not isinstance(analysis, bool):
            raise invalid(f"{where}.analysis must be true or false", field=f"{where}.analysis")
        weight = _number(step["weight"], field=f"{where}.weight", low=0, high=100, integer=True)
        if weight == 0 and analysis:
            raise invalid(f"{where}.analysis needs traffic to compare: a step of weight 0 cannot be analysed "
                          "(set analysis false for a pause without traffic)", field=f"{where}.analysis")
        cleaned.append({
            "weight": weight,
            "duration_s": _number(step["duration_s"], field=f"{where}.duration_s", low=1, high=MAX_STEP_S,
                                  integer=False),
            "analysis": analysis,
        })
    return cleaned


def validate_ab(split, duration_s) -> list[dict]:
    """An A/B experiment as one step: B's share (1..99, default 50) for `duration_s` (required)."""
    split = 50 if split is None else _number(split, field="split", low=1, high=99, integer=True)
    if duration_s is None:
        raise invalid("duration_s is required for an A/B experiment (when it ends and reports)", field="duration_s")
    duration_s = _number(duration_s, field="duration_s", low=1, high=MAX_STEP_S, integer=False)
    return [{"weight": split, "duration_s": duration_s, "analysis": False}]


def validate_conditions(analysis) -> dict:
    conditions = dict(DEFAULT_CONDITIONS)
    if analysis is None:
        return conditions
    if not isinstance(analysis, dict):
        raise invalid("analysis must be an object of conditions", field="analysis")
    for key, value in analysis.items():
        if key not in _CONDITIONS:
            raise invalid(f"analysis.{key} is not a condition; known: {', '.join(_CONDITIONS)}",
                          field=f"analysis.{key}")
        low, high, integer = _CONDITIONS[key]
        conditions[key] = _number(value, field=f"analysis.{key}", low=low, high=high, integer=integer)
    return conditions
