"""Celery task of the rollouts app (queue `periodic`; beat entry in apps.py): a thin wrapper over the driver."""
from __future__ import annotations

from celery import shared_task
from django.db import OperationalError

from controlplane.rollouts.driver import drive_rollouts

DRIVE_ROLLOUTS = "controlplane.rollouts.tasks.drive_rollouts_task"


@shared_task(name=DRIVE_ROLLOUTS, autoretry_for=(OperationalError,), retry_backoff=1, retry_backoff_max=10,
             max_retries=3, ignore_result=True)
def drive_rollouts_task() -> dict:
    return {str(key): value for key, value in drive_rollouts().items()}
