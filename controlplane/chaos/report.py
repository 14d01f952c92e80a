"""A chaos run's report: the hypothesis before, during and after the faults, the recovery time, the requests the
gateway counted from its last scrape before the run to its newest scrape by the run's end (sent, failed, migrated,
retried), the gateway windows read over the scrape interval because they are shorter (widened), every fault as the
node agent reported it (injected, reverted), the Action rows the system wrote meanwhile, and the verdict.

Built live for a run in progress and stored once the run finishes (ChaosRun.report)."""
from __future__ import annotations

from django.utils import timezone

from controlplane.agent.faults import injected_key, reverted_key
from controlplane.chaos.hypothesis import scrape_numbers
from controlplane.chaos.models import ChaosRun, Verdict
from controlplane.chaos.readings import gateway_scrapes, widened
from controlplane.models import Action

MAX_ACTIONS = 200


def _iso(moment) -> str | None:
    return moment.isoformat() if moment else None


def _action_row(action: Action, run: ChaosRun) -> dict:
    return {"id": action.pk, "url": f"/api/v1/actions/{action.pk}/", "kind": action.kind,
            "event": (action.params or {}).get("event"), "actor": action.actor, "actor_type": action.actor_type,
            "worker": action.worker_id, "status": action.status, "reason": action.reason,
            "created_at": _iso(action.created_at),
            "chaos": (action.params or {}).get("chaos_run") == run.pk}


def fault_outcomes(run: ChaosRun) -> list[dict]:
    """Each (fault, target) with the agent's rows: {"injected": {...} | None, "reverted": {...} | None}."""
    keys = [key for fault in run.faults for key in (injected_key(fault["key"]), reverted_key(fault["key"]))]
    rows = {a.idempotency_key: a for a in Action.objects.filter(idempotency_key__in=keys)}
    outcomes = []
    for fault in run.faults:
        entry = {"kind": fault["kind"], "worker": fault["worker"], "duration_s": fault.get("duration_s")}
        for event, key in (("injected", injected_key(fault["key"])), ("reverted", reverted_key(fault["key"]))):
            row = rows.get(key)
            entry[event] = None if row is None else {
                "action": row.pk, "ok": row.status == "succeeded", "outcome": (row.result or {}).get("outcome"),
                "by": (row.result or {}).get("by"), "at": _iso(row.created_at), "error": (row.result or {}).get("error")}
        outcomes.append(entry)
    return outcomes


def _during(run: ChaosRun) -> dict:
    passes = [entry for entry in run.timeline if entry["phase"] == "during"]
    deviations = [entry for entry in passes if not entry["holds"]]
    worst: dict[str, float] = {}
    for entry in passes:
        for check, value in zip(run.spec["hypothesis"], entry["values"]):
            if value is None:
                continue
            name = f"{check['metric']}:{check['role']}"
            higher_is_worse = "min" not in check
            current = worst.get(name)
            if current is None or (value > current if higher_is_worse else value < current):
                worst[name] = value
    return {"passes": len(passes), "held": len(passes) - len(deviations),
            "first_deviation_at": deviations[0]["t"] if deviations else None,
            "failing": sorted({why for entry in deviations for why in entry["failing"]}), "worst": worst}


def _requests(run: ChaosRun, end) -> dict | None:
    """What the gateway counted from the newest scrape at or before the run's start to the newest at or before its
    end (None until two such scrapes exist)."""
    # A datetime keeps microseconds: the scrape of the run's last pass may lie a fraction of one past its end.
    start_ts, end_ts = run.started_at.timestamp(), end.timestamp() + 1e-6
    opening = gateway_scrapes(run.deployment_id, start=start_ts, end=start_ts)
    closing = gateway_scrapes(run.deployment_id, start=end_ts, end=end_ts)
    if not opening or not closing or closing[-1]["ts"] <= opening[0]["ts"]:
        return None
    numbers = scrape_numbers(opening[0], closing[-1])
    return {"sent": numbers["requests"], "failed": numbers["errors"], "server_errors": numbers["server_errors"],
            "migrated": numbers["migrated"], "retried": numbers["retried"], "span_s": numbers["span_s"]}


def verdict_of(run: ChaosRun, faults: list[dict]) -> tuple[str, list[str]]:
    """(verdict, reasons). Aborted when an abort condition or an operator stopped it; failed when a fault was not
    injected or not reverted, or the hypothesis did not hold again within the recovery timeout; else passed."""
    reasons = []
    for fault in faults:
        where = f"{fault['kind']} of worker {fault['worker']}"
        if fault["injected"] is None or not fault["injected"]["ok"]:
            reasons.append(f"{where} was not injected" + (f": {fault['injected']['outcome']}"
                                                          if fault["injected"] else " (no word from the agent)"))
        elif fault["reverted"] is None and fault["kind"] == "agent_kill":
            reasons.append(f"{where}: not reverted: the node agent has not come back (nothing restarted it? run it "
                           "under a supervisor: make run, systemd Restart=)")
        elif fault["reverted"] is None:
            reasons.append(f"{where}: no revert reported by the agent")
    if run.recovered_at is None:
        reasons.append(f"the hypothesis did not hold again within {run.spec['recovery_timeout_s']:g} s of the "
                       "revert")
    if run.abort_reason:
        return Verdict.ABORTED, [run.abort_reason, *reasons]
    return (Verdict.FAILED if reasons else Verdict.PASSED), reasons


def progress_of(run: ChaosRun, faults: list[dict], now) -> list[str]:
    """Where a run that has not finished stands, one line per step: what it has done and what it waits for. A
    running run has earned no verdict and no reasons for one."""
    lines = []
    for fault in faults:
        where = f"{fault['kind']} of worker {fault['worker']}"
        if fault["injected"] is None:
            lines.append(f"{where}: waiting for the agent to inject it")
        elif not fault["injected"]["ok"]:
            lines.append(f"{where}: not injected: {fault['injected']['outcome']}")
        elif fault["reverted"] is None:
            lines.append(f"{where}: injected ({fault['injected']['outcome']}); reverted at the fault's end")
        else:
            lines.append(f"{where}: injected and reverted ({fault['reverted']['outcome']})")
    if run.reverted_at is None and run.fault_ends_at is not None and now < run.fault_ends_at:
        lines.append(f"the faults end in {(run.fault_ends_at - now).total_seconds():.0f} s")
    elif run.reverted_at is not None and run.recovered_at is None:
        left = run.spec["recovery_timeout_s"] - (now - run.reverted_at).total_seconds()
        lines.append(f"waiting for the hypothesis to hold again ({max(0.0, left):.0f} s of the recovery timeout "
                     "left)")
    elif run.recovered_at is not None:
        lines.append("the hypothesis holds again")
    return lines


def run_report(run: ChaosRun) -> dict:
    now = timezone.now()
    end = run.finished_at or now
    faults = fault_outcomes(run)
    verdict, reasons = verdict_of(run, faults)
    if run.finished_at is None:
        reasons = []  # not earned yet: `progress` says where the run stands
    after = next((entry for entry in reversed(run.timeline) if entry["phase"] == "after"), None)
    recovery_s = ((run.recovered_at - run.reverted_at).total_seconds()
                  if run.recovered_at and run.reverted_at else None)
    actions = (Action.objects.filter(deployment_id=run.deployment_id, created_at__gte=run.started_at,
                                     created_at__lte=end).order_by("created_at", "id")[:MAX_ACTIONS])
    return {
        "chaos_run": run.pk, "experiment": run.spec.get("name"), "deployment": run.deployment.name,
        "status": run.status, "verdict": verdict if run.finished_at else None, "reasons": reasons,
        "progress": progress_of(run, faults, now) if run.finished_at is None else None,
        "started_at": _iso(run.started_at), "fault_ends_at": _iso(run.fault_ends_at),
        "reverted_at": _iso(run.reverted_at), "recovered_at": _iso(run.recovered_at),
        "finished_at": _iso(run.finished_at), "recovery_s": round(recovery_s, 3) if recovery_s is not None else None,
        "abort_reason": run.abort_reason or None,
        "targets": run.targets, "faults": faults,
        "hypothesis": {"checks": run.spec["hypothesis"], "before": run.baseline, "during": _during(run),
                       "after": after},
        "requests": _requests(run, end),
        "widened": widened(run.spec),
        "actions": [_action_row(action, run) for action in actions],
    }
