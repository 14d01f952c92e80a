"""Celery tasks of the replay app (queue `periodic`; the beat entry in apps.py)."""
from __future__ import annotations

from celery import shared_task

from controlplane.lib.single_pass import single_pass
from controlplane.replay.ingest import pull_all


@shared_task(name="replay.pull_traces", ignore_result=True)
def pull_traces_task() -> dict:
    """Read every serving gateway's request trace into its deployment's recorded trace; none while another pull
    runs (single_pass)."""
    with single_pass("replay.pull_traces") as mine:
        if not mine:
            return {"skipped": "another trace pull is running"}
        return pull_all()
