from django.apps import AppConfig


class AlertingConfig(AppConfig):
    name = "controlplane.alerting"
    label = "alerting"
    verbose_name = "Tandem alerting"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Default rules for every new deployment: a signal here rather than a call in deployment_create, so that
        # the core services do not depend on this app.
        from django.db.models.signals import post_save

        from controlplane.alerting.services.defaults import on_deployment_saved
        from controlplane.models import Deployment

        post_save.connect(on_deployment_saved, sender=Deployment, dispatch_uid="alerting-default-rules")
        # The control-loop alert is stepped by the web process's /healthz probes (watchdog.py says why).
        from controlplane.alerting.services.watchdog import on_healthz_probed
        from controlplane.observability.healthz import probed

        probed.connect(on_healthz_probed, dispatch_uid="alerting-control-loop-watchdog")
        _schedule_evaluation()
        # Registered in every process: notifications enqueue deliveries by task name.
        from controlplane.alerting import tasks  # noqa: F401


def _schedule_evaluation() -> None:
    """The evaluation pass every TANDEM_ALERT_EVAL_INTERVAL_S (a pass that waited longer is stale: the next one is
    already due), lost deliveries sent again every minute, history pruned every hour."""
    from django.conf import settings

    from controlplane.celery import schedule_periodic

    schedule_periodic({
        "alerting-evaluate": ("controlplane.alerting.tasks.evaluate_rules_task",
                              float(settings.TANDEM_ALERT_EVAL_INTERVAL_S)),
        "alerting-resend-lost-deliveries": ("controlplane.alerting.tasks.deliveries_sweep_task", 60.0),
        "alerting-prune-history": ("controlplane.alerting.tasks.history_prune_task", 3600.0),
    })
