from django.apps import AppConfig


class AutoscalingConfig(AppConfig):
    """The per-pool autoscaler and its policy table (AutoscalingPolicy, whose table the observability app created
    and whose name it keeps); it gives capacity its policies' targets (controlplane.capacity.autoscale_targets)."""

    name = "controlplane.autoscaling"
    label = "autoscaling"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from controlplane.autoscaling.selectors import policy_targets
        from controlplane.capacity import autoscale_targets
        from controlplane.celery import schedule_periodic

        autoscale_targets.provide(policy_targets)
        # One evaluation per scrape interval: the autoscaler reads the newest pool aggregates the scraper stored.
        schedule_periodic({"autoscaling-evaluate": ("autoscaling.autoscale_cycle",
                                                      float(settings.TANDEM_SCRAPE_INTERVAL_S))})
