from django.apps import AppConfig


class RolloutsConfig(AppConfig):
    """Canary and A/B rollouts of a revision beside the stable one; the driver steps them every
    TANDEM_ROLLOUT_INTERVAL_S on the periodic queue. The core reads a deployment's rollout through
    controlplane.rollout_provider, which this app fills in."""

    name = "controlplane.rollouts"
    label = "rollouts"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from controlplane import rollout_provider
        from controlplane.celery import schedule_periodic
        from controlplane.rollouts import selectors
        from controlplane.rollouts import tasks  # noqa: F401  (registered in every process)

        rollout_provider.provide(rollout_provider.RolloutProvider(
            rollout_active=selectors.rollout_active, tried_replicas=selectors.tried_replicas,
            traffic_weights=selectors.traffic_weights, variant_names=selectors.variant_names,
            rollouts_latest=selectors.rollouts_latest))
        schedule_periodic({
            "rollouts-drive": ("controlplane.rollouts.tasks.drive_rollouts_task",
                               float(settings.TANDEM_ROLLOUT_INTERVAL_S)),
        })
