from django.apps import AppConfig


class CapacityConfig(AppConfig):
    """Stage profiles, the capacity planner, per-pool schedules and predictive floors."""

    name = "controlplane.capacity"
    label = "capacity"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from controlplane.capacity import tasks  # noqa: F401  (registers the profile task)
        from controlplane.celery import schedule_periodic

        schedule_periodic({"capacity-live-refine": ("capacity.live_refine",
                                                      float(settings.TANDEM_CAPACITY_LIVE_REFINE_INTERVAL_S))})
