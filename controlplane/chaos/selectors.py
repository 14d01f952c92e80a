"""Reads of chaos experiments and runs shared by the API, the driver and the services."""
from __future__ import annotations

from controlplane.chaos.models import ACTIVE_STATUSES, ChaosRun, ChaosSettings, Experiment
from controlplane.errors import not_found

MAX_ID = 2**63 - 1


def chaos_settings_of(deployment) -> ChaosSettings:
    """The deployment's opt-in row, or an unsaved one (off) when nobody has set it."""
    return ChaosSettings.objects.filter(deployment=deployment).first() or ChaosSettings(deployment=deployment)


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
