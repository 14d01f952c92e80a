from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    """Canary and A/B rollouts of a revision beside the stable one; the driver steps them every
    TANDEM_ROLLOUT_INTERVAL_S on the periodic queue."""

    name = "controlplane.rollouts"
    label = "rollouts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from controlplane.celery import schedule_periodic
        from controlplane.rollouts import tasks  # noqa: F401  (registered in every process)

        schedule_periodic({
            "rollouts-drive": ("controlplane.rollouts.tasks.drive_rollouts_task",
                               float(settings.TANDEM_ROLLOUT_INTERVAL_S)),
            "rollouts-prune-revision-samples": ("controlplane.rollouts.tasks.prune_revision_samples_task", 60.0),
        })
