"""What the deployment page's chaos card shows: whether the deployment opted in, its experiments and game days,
the active run with its checks as the driver last judged them, recent runs with their verdicts, and the templates,
roles and nodes its form offers (dashboards.views.chaos); and the windows in which a chaos fault was active, which
every chart of the page shades (charts.shade_windows)."""
from __future__ import annotations

from datetime import datetime, timezone

from django.conf import settings

from controlplane.agent.fault_holds import FAULT_KIND
from controlplane.chaos.hypothesis import judge_hypothesis
from controlplane.chaos.library import TEMPLATES
from controlplane.chaos.selectors import chaos_settings_of, experiment_list, run_list, schedule_list, target_nodes
from controlplane.models import Action, ActionStatus, WorkerRole

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
        "templates": TEMPLATES,
        "roles": [*deployment.roles, WorkerRole.GATEWAY],  # what a target may name (no query: the mode says)
        "nodes": target_nodes(deployment),
    }


def chaos_windows(deployment, *, start: float, end: float) -> list[dict]:
    """The windows of [start, end] in which a chaos fault was active, from the node agents' Action rows: from a
    fault's `fault_injected` row (succeeded) to its `fault_reverted` row, or, while none exists, to its deadline or
    `end`. One window per run and fault kind (a fault on several workers is one band), oldest first:
    [{"start", "end", "run", "fault", "label"}]."""
    # A fault lasts at most TANDEM_CHAOS_MAX_DURATION_S: one injected that long before the range can reach into it.
    since = datetime.fromtimestamp(start - settings.TANDEM_CHAOS_MAX_DURATION_S - 60, tz=timezone.utc)
    rows = (Action.objects.filter(deployment=deployment, kind=FAULT_KIND,
                                  params__event__in=("fault_injected", "fault_reverted"), created_at__gte=since)
            .values_list("idempotency_key", "params", "result", "status", "created_at"))
    injected, reverted = {}, {}
    for key, params, result, status, created in rows:
        fault, _, event = (key or "").rpartition(":")
        if event == "injected" and status == ActionStatus.SUCCEEDED:
            injected[fault] = (params, result, created.timestamp())
        elif event == "reverted":
            reverted[fault] = created.timestamp()
    merged: dict[tuple, list[float]] = {}
    for fault, (params, result, began) in injected.items():
        until = result.get("until") if isinstance(result.get("until"), (int, float)) else None
        ended = reverted.get(fault, min(until, end) if until else end)
        if ended < start or began > end:
            continue
        span = merged.setdefault((params.get("chaos_run"), params.get("fault", "")), [began, ended])
        span[0], span[1] = min(span[0], began), max(span[1], ended)
    windows = [{"start": max(began, start), "end": min(ended, end), "run": run, "fault": fault,
                "label": f"chaos run {run}: {fault}" if run is not None else f"chaos: {fault}"}
               for (run, fault), (began, ended) in merged.items()]
    return sorted(windows, key=lambda window: (window["start"], str(window["run"]), window["fault"]))
