"""The Celery app "tandem": queue `control` (reconcile, health) and one queue `node.<name>` per node agent.

Configuration comes from Django settings with the CELERY_ prefix (controlplane/settings.py); tasks live in
controlplane/tasks.py. Beat runs reconcile_all and check_health every TANDEM_RECONCILE_INTERVAL_S; each beat message
expires after one interval, so a control worker that was down does not wake up to a backlog of stale passes.
"""
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("tandem")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

CONTROL_QUEUE = "control"


@app.on_after_configure.connect
def _schedule(sender, **kwargs):
    from django.conf import settings

    interval = float(settings.TANDEM_RECONCILE_INTERVAL_S)
    options = {"queue": CONTROL_QUEUE, "expires": interval}
    # Merged, not assigned: other apps (observability, alerting) add their own periodic tasks.
    sender.conf.beat_schedule = {
        **(sender.conf.beat_schedule or {}),
        "reconcile-all": {"task": "controlplane.tasks.reconcile_all", "schedule": interval, "options": options},
        "check-health": {"task": "controlplane.tasks.check_health", "schedule": interval, "options": options},
    }
    # Control tasks never go to a node queue by accident; agent tasks are always sent with an explicit queue.
    sender.conf.task_routes = {
        **(sender.conf.task_routes or {}),
        "controlplane.tasks.reconcile_deployment": {"queue": CONTROL_QUEUE},
        "controlplane.tasks.reconcile_all": {"queue": CONTROL_QUEUE},
        "controlplane.tasks.check_health": {"queue": CONTROL_QUEUE},
    }
