from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Scraping, storage, the query API and the control plane's own /metrics. Its models include the autoscaler's
    policy table (the autoscaler's code is controlplane.autoscaling)."""

    name = "controlplane.observability"
    label = "observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Our beat entries join the Celery app's schedule once it is configured (controlplane/celery.py assigns its
        # own schedule in on_after_configure; on_after_finalize comes later, so the update is not overwritten).
        from controlplane.celery import app

        app.on_after_finalize.connect(_schedule, weak=False)


def _schedule(sender, **kwargs) -> None:
    from django.conf import settings

    interval = float(settings.TANDEM_SCRAPE_INTERVAL_S)
    queue = {"queue": "control"}
    sender.conf.beat_schedule.update({
        # Each message expires after one interval: a control worker that was down wakes up to one fresh cycle,
        # not a backlog of stale ones.
        "observability-scrape": {"task": "observability.scrape_cycle", "schedule": interval,
                                 "options": {**queue, "expires": interval}},
        "observability-rollup": {"task": "observability.rollup_and_prune", "schedule": 60.0,
                                 "options": {**queue, "expires": 60.0}},
    })
    sender.conf.task_routes = {**(sender.conf.task_routes or {}),
                               "observability.scrape_cycle": queue, "observability.rollup_and_prune": queue}
