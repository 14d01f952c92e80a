"""The chaos driver: one pass every TANDEM_CHAOS_INTERVAL_S (Celery beat, periodic queue).

The gateway numbers it judges are the observability app's: its scrape cycle keeps the gateway's counters at each
scrape, and the driver reads them through the metrics backend's reader (readings.py), before a run (run_start reads
the window that ends then) as during and after it.

A pass (drive_chaos):
1. Start the schedules whose time has come (schedules.schedules_start_due).
2. Step every active run (drive_run):
   - running: the abort conditions first (one breached for its `for_s` reverts every fault at once, and the run
     is aborted); then the hypothesis over each check's window, recorded on the timeline (a deviation during the
     faults is what the experiment measures, not a reason to stop); once the faults' time is up, revert them all.
   - recovering: the hypothesis over windows that start no earlier than the revert; the first pass where it holds
     is the recovery. The run finishes once it has recovered and the agent has reported every revert, or when the
     recovery timeout has passed (then it fails, and the report names what is missing).

Idempotent: every move is a conditional UPDATE on the status read (services), so two drivers at once, or a driver
killed mid-pass, neither skip nor repeat a move; a pause outlives neither: the agent releases it at its deadline.
"""
from __future__ import annotations

import logging
import time
from datetime import datetime, timezone as dt_timezone

from controlplane.agent.faults import reverted_key
from controlplane.chaos.hypothesis import abort_decision, judge_hypothesis
from controlplane.chaos.models import ACTIVE_STATUSES, ChaosRun, RunStatus
from controlplane.chaos.readings import check_values
from controlplane.chaos.schedules import schedules_start_due
from controlplane.chaos.services import SYSTEM, run_finish, run_recovered, run_revert
from controlplane.models import Action

log = logging.getLogger(__name__)
MAX_TIMELINE = 2000  # passes kept on a run's timeline (the duration is bounded; this bounds the row)


def drive_chaos(*, now: float | None = None) -> dict:
    """One pass (numbered steps in the module docstring). Returns what it did, for logs and tests."""
    now = time.time() if now is None else now
    # Read before the schedules start theirs: a run is first stepped by the pass after its start.
    active = list(ChaosRun.objects.filter(status__in=ACTIVE_STATUSES).values_list("id", flat=True))
    scheduled = schedules_start_due(now=now)
    runs = {}
    for run_id in active:
        try:
            runs[run_id] = drive_run(run_id, now=now)
        except Exception:
            # One broken run must not stop the others.
            log.exception("driving chaos run %s failed", run_id)
            runs[run_id] = "error"
    return {"scheduled": scheduled, "runs": runs}


def _append(run: ChaosRun, entry: dict, **fields) -> None:
    timeline = (run.timeline + [entry])[-MAX_TIMELINE:]
    ChaosRun.objects.filter(pk=run.pk, status=run.status).update(timeline=timeline, **fields)
    run.timeline = timeline


def _moment(now: float) -> datetime:
    return datetime.fromtimestamp(now, tz=dt_timezone.utc)


def _entry(now: float, phase: str, judged: dict, values: list) -> dict:
    return {"t": round(now, 3), "phase": phase, "holds": judged["holds"], "values": values,
            "failing": judged["failing"]}


def _reverts_reported(run: ChaosRun) -> bool:
    keys = [reverted_key(fault["key"]) for fault in run.faults]
    return Action.objects.filter(idempotency_key__in=keys).count() == len(keys)


def drive_run(run_id: int, *, now: float | None = None) -> str:
    """One pass over one active run (see the module docstring). Returns what it did."""
    now = time.time() if now is None else now
    run = ChaosRun.objects.select_related("deployment").filter(pk=run_id, status__in=ACTIVE_STATUSES).first()
    if run is None:
        return "not active"
    spec = run.spec
    baselines = run.baseline.get("values")
    if run.status == RunStatus.RUNNING:
        conditions = spec["abort_conditions"]
        values = check_values(run.deployment_id, conditions, now=now) if conditions else []
        breaches, reason = abort_decision(conditions, values, run.breaches, now)
        if breaches != run.breaches:
            ChaosRun.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(breaches=breaches)
        if reason is not None:
            run_revert(run=run, actor=SYSTEM, reason=reason, abort=True, at=_moment(now))
            return "aborted"
        values = check_values(run.deployment_id, spec["hypothesis"], now=now)
        judged = judge_hypothesis(spec["hypothesis"], values, baselines)
        _append(run, _entry(now, "during", judged, values))
        if now >= run.fault_ends_at.timestamp():
            moved = run_revert(run=run, actor=SYSTEM, reason="the experiment's duration is over", at=_moment(now))
            return "reverted" if moved else "taken by another driver"
        return "in fault"
    since = run.reverted_at.timestamp()
    values = check_values(run.deployment_id, spec["hypothesis"], now=now, since=since)
    judged = judge_hypothesis(spec["hypothesis"], values, baselines)
    _append(run, _entry(now, "after", judged, values))
    if judged["holds"] and run.recovered_at is None:
        run_recovered(run=run, at=_moment(now))
        run.refresh_from_db()
    timed_out = now - since > spec["recovery_timeout_s"]
    if (run.recovered_at is not None and _reverts_reported(run)) or timed_out:
        run_finish(run=run, at=_moment(now))
        return "finished"
    return "recovered; waiting for the agent's reverts" if run.recovered_at else "recovering"
