from django.apps import AppConfig


class AutoscalingConfig(AppConfig):
    """The per-pool autoscaler. It has no models of its own: its policy table (AutoscalingPolicy) stays in the
    observability app, where its migration created it."""

    name = "controlplane.autoscaling"
    label = "autoscaling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from controlplane.celery import schedule_periodic

        # One evaluation per scrape interval: the autoscaler reads the newest pool aggregates the scraper stored.
        schedule_periodic({"autoscaling-evaluate": ("autoscaling.autoscale_cycle",
                                                      float(settings.TANDEM_SCRAPE_INTERVAL_S))})
