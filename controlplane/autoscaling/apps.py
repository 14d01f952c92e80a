from django.apps import AppConfig


class AutoscalingConfig(AppConfig):
    """The per-pool autoscaler. It has no models of its own: its policy table (AutoscalingPolicy) stays in the
    observability app, where its migration created it."""

    name = "controlplane.autoscaling"
    label = "autoscaling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # As in observability/apps.py: controlplane/celery.py assigns its own schedule in on_after_configure;
        # on_after_finalize comes later, so this update is not overwritten.
        from controlplane.celery import app

        app.on_after_finalize.connect(_schedule, weak=False)


def _schedule(sender, **kwargs) -> None:
    from django.conf import settings

    # One evaluation per scrape interval: the autoscaler reads the newest pool aggregates the scraper stored.
    interval = float(settings.TANDEM_SCRAPE_INTERVAL_S)
    queue = {"queue": "control"}
    # Each message expires after one interval: a control worker that was down wakes up to one fresh evaluation,
    # not a backlog of stale ones.
    sender.conf.beat_schedule.update({
        "autoscaling-evaluate": {"task": "autoscaling.autoscale_cycle", "schedule": interval,
                                 "options": {**queue, "expires": interval}},
    })
    sender.conf.task_routes = {**(sender.conf.task_routes or {}), "autoscaling.autoscale_cycle": queue}
