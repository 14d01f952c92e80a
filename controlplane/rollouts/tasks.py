"""Celery task of the rollouts app (queue `periodic`; beat entry in apps.py): a thin wrapper over the driver."""
from __future__ import annotations

import time

from celery import shared_task
from django.conf import settings
from django.db import OperationalError

from controlplane.rollouts.driver import drive_rollouts
from controlplane.rollouts.models import RevisionSample

DRIVE_ROLLOUTS = "controlplane.rollouts.tasks.drive_rollouts_task"
PRUNE_REVISION_SAMPLES = "controlplane.rollouts.tasks.prune_revision_samples_task"


@shared_task(name=DRIVE_ROLLOUTS, autoretry_for=(OperationalError,), retry_backoff=1, retry_backoff_max=10,
             max_retries=3, ignore_result=True)
def drive_rollouts_task() -> dict:
    return {str(key): value for key, value in drive_rollouts().items()}


@shared_task(name=PRUNE_REVISION_SAMPLES, ignore_result=True)
def prune_revision_samples_task() -> int:
    """Per-revision series are kept as long as raw samples (TANDEM_METRICS_RAW_RETENTION_S)."""
    cutoff = time.time() - settings.TANDEM_METRICS_RAW_RETENTION_S
    num_deleted, _ = RevisionSample.objects.filter(ts__lt=cutoff).delete()
    return num_deleted
