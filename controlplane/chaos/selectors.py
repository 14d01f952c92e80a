"""Reads of chaos experiments and runs shared by the API, the driver and the services."""
from __future__ import annotations

from datetime import datetime, timezone as dt_timezone

from django.db.models import Q

from controlplane.chaos.hypothesis import judge_hypothesis
from controlplane.chaos.models import ACTIVE_STATUSES, ChaosRun, ChaosSchedule, ChaosSettings, Experiment
from controlplane.chaos.readings import check_values
from controlplane.errors import not_found
from controlplane.models import Node, WorkerPurpose, WorkerStatus
from controlplane.rollouts.analysis import LATENCY_FLOOR_S

MAX_ID = 2**63 - 1
# How long after a run ends its baselines still stand for the experiment's `max_baseline_ratio` checks.
BASELINE_KEEP_S = 600


def chaos_settings_of(deployment) -> ChaosSettings:
    """The deployment's opt-in row, or an unsaved one (off) when nobody has set it."""
    return ChaosSettings.objects.filter(deployment=deployment).first() or ChaosSettings(deployment=deployment)


def target_nodes(deployment) -> list[str]:
    """The names of the nodes a node target of the deployment may name now: those running a serving worker of it
    that is not stopped or failed (validation.validate_target_node's rule)."""
    return list(Node.objects.filter(workers__deployment=deployment, workers__purpose=WorkerPurpose.SERVING)
                .exclude(workers__status__in=(WorkerStatus.STOPPED, WorkerStatus.FAILED))
                .order_by("name").values_list("name", flat=True).distinct())


def experiment_list(deployment):
    return Experiment.objects.filter(deployment=deployment).select_related("created_by")


def experiment_get(deployment, name: str) -> Experiment:
    experiment = experiment_list(deployment).filter(name=name).first()
    if experiment is None:
        raise not_found(f"deployment {deployment.name!r} has no chaos experiment {name!r}")
    return experiment


def run_list(deployment):
    return ChaosRun.objects.filter(deployment=deployment).select_related("deployment", "experiment", "created_by")


def run_get(deployment, run_id: int) -> ChaosRun:
    if not isinstance(run_id, int) or not 0 < run_id <= MAX_ID:
        raise not_found(f"chaos run {run_id!r} does not exist")
    run = run_list(deployment).filter(pk=run_id).first()
    if run is None:
        raise not_found(f"deployment {deployment.name!r} has no chaos run {run_id}")
    return run


def run_active(deployment) -> ChaosRun | None:
    """The running or recovering run of a deployment (at most one: a partial unique constraint)."""
    return run_list(deployment).filter(status__in=ACTIVE_STATUSES).first()


def schedule_list(deployment):
    return ChaosSchedule.objects.filter(deployment=deployment).select_related("experiment", "created_by")


def schedule_get(deployment, schedule_id: int) -> ChaosSchedule:
    schedule = schedule_list(deployment).filter(pk=schedule_id).first() if 0 < schedule_id <= MAX_ID else None
    if schedule is None:
        raise not_found(f"deployment {deployment.name!r} has no chaos schedule {schedule_id}")
    return schedule


def experiment_steady_state(experiment: Experiment, *, now: float) -> dict:
    """The experiment's hypothesis judged now, each check over its window ending now, as a run's start judges it:
    what the Chaos Toolkit probes read. Each check gets its value, limit and verdict, and a `max_baseline_ratio`
    check its `ratio` (value / baseline, the floor of canary analysis applied to the baseline).

    The baselines are those of the experiment's newest run while it is active or for BASELINE_KEEP_S after it
    ended, when it ran the hypothesis as it stands (so the check after `chaos run`'s method compares with the
    values before the faults); else the values now, as before a run."""
    checks = experiment.hypothesis
    values = check_values(experiment.deployment_id, checks, now=now)
    since = datetime.fromtimestamp(now - BASELINE_KEEP_S, tz=dt_timezone.utc)
    run = (ChaosRun.objects.filter(experiment=experiment)
           .filter(Q(status__in=ACTIVE_STATUSES) | Q(finished_at__gte=since)).order_by("-id").first())
    if run is not None and run.spec.get("hypothesis") == checks and run.baseline.get("values") is not None:
        baselines, baseline_run = run.baseline["values"], run.pk
    else:
        baselines, baseline_run = values, None
    judged = judge_hypothesis(checks, values, baselines)
    results = []
    for check, result, baseline in zip(checks, judged["checks"], baselines):
        item = {**check, **result}
        if "max_baseline_ratio" in check:
            item["baseline"] = baseline
            item["ratio"] = None if result["value"] is None or baseline is None \
                else result["value"] / max(baseline, LATENCY_FLOOR_S)
        results.append(item)
    return {"experiment": experiment.name, "at": now, "holds": judged["holds"], "baseline_run": baseline_run,
            "checks": results, "failing": judged["failing"]}
