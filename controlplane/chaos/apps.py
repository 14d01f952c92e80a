from django.apps import AppConfig


class ChaosConfig(AppConfig):
    """Chaos experiments; the driver starts the game days that are due and steps every active run every
    TANDEM_CHAOS_INTERVAL_S on the periodic queue, on the gateway numbers the observability app scraped. The node
    agent carries out the faults (controlplane.agent.faults); the core never imports this app."""

    name = "controlplane.chaos"
    label = "chaos"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from controlplane.celery import schedule_periodic
        from controlplane.chaos import tasks  # noqa: F401  (registered in every process)

        schedule_periodic({
            "chaos-drive": ("controlplane.chaos.tasks.drive_chaos_task", float(settings.TANDEM_CHAOS_INTERVAL_S)),
        })
