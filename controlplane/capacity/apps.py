from django.apps import AppConfig


class CapacityConfig(AppConfig):
    """Stage profiles, the capacity planner, per-pool schedules and predictive floors."""

    name = "controlplane.capacity"
    label = "capacity"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from controlplane.capacity import tasks  # noqa: F401  (registers the profile task)
