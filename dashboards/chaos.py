"""What the deployment page's chaos card shows: whether the deployment opted in, its experiments and game days,
the active run with its checks as the driver last judged them, and recent runs with their verdicts."""
from __future__ import annotations

from controlplane.chaos.hypothesis import judge_hypothesis
from controlplane.chaos.selectors import chaos_settings_of, experiment_list, run_list, schedule_list

NUM_RECENT_RUNS = 5


def _last_checks(run) -> list[dict]:
    """The active run's checks as its last driver pass judged them (before its first pass: as at its start)."""
    checks = run.spec.get("hypothesis", [])
    baselines = run.baseline.get("values")
    values = run.timeline[-1]["values"] if run.timeline else baselines or [None] * len(checks)
    judged = judge_hypothesis(checks, values, baselines)["checks"]
    return [{"metric": check["metric"], "role": check["role"],
             "bound": next(key for key in ("max", "min", "max_baseline_ratio") if key in check),
             "limit": result["limit"], "value": result["value"], "holds": result["holds"], "why": result["why"]}
            for check, result in zip(checks, judged)]


def chaos_section(deployment) -> dict:
    """What the deployment page's chaos card shows."""
    # One query for both: a run starts only while none is active, so an active run is the newest.
    runs = list(run_list(deployment)[:NUM_RECENT_RUNS + 1])
    active = runs[0] if runs and runs[0].is_active else None
    return {
        "enabled": chaos_settings_of(deployment).enabled,
        "experiments": list(experiment_list(deployment)),
        "schedules": list(schedule_list(deployment)),
        "active": active,
        "active_checks": _last_checks(active) if active else [],
        "active_phase": active.timeline[-1]["phase"] if active and active.timeline else None,
        "recent": [run for run in runs if not run.is_active][:NUM_RECENT_RUNS],
    }
