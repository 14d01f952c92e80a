"""Celery tasks of the capacity app (queue `control`): a profile run, a thin wrapper over
services.profile_jobs.profile_job_run, and the periodic live refinement of the profiles."""
from __future__ import annotations

from celery import shared_task

from controlplane.capacity.services.profile_jobs import PROFILE_TASK, profile_job_fail, profile_job_run
from controlplane.capacity.services.profiles import live_refine_all


@shared_task(name=PROFILE_TASK, ignore_result=True, acks_late=False)
def profile_task(job_id: int) -> dict:
    """Run one profile job; the job row carries progress and the outcome."""
    try:
        job = profile_job_run(job_id)
    except Exception as exc:  # the row must not stay "running" forever
        profile_job_fail(job_id, f"{type(exc).__name__}: {exc}")
        raise
    return {"job": job_id, "status": None if job is None else job.status}


@shared_task(name="capacity.live_refine", ignore_result=True)
def live_refine_task() -> dict:
    """Add live points from the scraped series to the current revisions' profiles (beat, every few minutes)."""
    return {"points": live_refine_all()}
