from django.apps import AppConfig


class AutoscalingConfig(AppConfig):
    """The per-pool autoscaler and its policy table (AutoscalingPolicy, whose table the observability app created
    and whose name it keeps)."""

    name = "controlplane.autoscaling"
    label = "autoscaling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from controlplane.celery import schedule_periodic

        # One evaluation per scrape interval: the autoscaler reads the newest pool aggregates the scraper stored.
        schedule_periodic({"autoscaling-evaluate": ("autoscaling.autoscale_cycle",
                                                      float(settings.TANDEM_SCRAPE_INTERVAL_S))})
