"""Celery task of the chaos app (queue `periodic`; beat entry in apps.py): a thin wrapper over the driver."""
from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from controlplane.chaos.driver import drive_chaos

DRIVE_CHAOS = "controlplane.chaos.tasks.drive_chaos_task"


@shared_task(name=DRIVE_CHAOS, autoretry_for=(OperationalError,), retry_backoff=1, retry_backoff_max=10,
             max_retries=3, ignore_result=True)
def drive_chaos_task() -> dict:
    done = drive_chaos()
    return {"scheduled": {str(k): v for k, v in done["scheduled"].items()},
            "runs": {str(k): v for k, v in done["runs"].items()}}
