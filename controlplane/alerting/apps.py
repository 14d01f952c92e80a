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
        _schedule_evaluation()
        # Registered in every process: notifications enqueue deliveries by task name.
        from controlplane.alerting import tasks  # noqa: F401


def _schedule_evaluation() -> None:
    """Add the evaluation pass to Celery beat. controlplane/celery.py assigns beat_schedule wholesale when Celery
    configures itself, so this runs after that (on_after_configure) or at once if Celery is already configured."""
    from controlplane.celery import app

    def add(sender=None, **kwargs):
        from django.conf import settings

        interval = float(settings.TANDEM_ALERT_EVAL_INTERVAL_S)
        schedule = dict(app.conf.beat_schedule or {})
        schedule["alerting-evaluate"] = {
            "task": "controlplane.alerting.tasks.evaluate_rules_task", "schedule": interval,
            # A pass that waited longer than one interval is stale: the next one is already due.
            "options": {"queue": "control", "expires": interval},
        }
        schedule["alerting-resend-lost-deliveries"] = {
            "task": "controlplane.alerting.tasks.deliveries_sweep_task", "schedule": 60.0,
            "options": {"queue": "control", "expires": 60.0},
        }
        schedule["alerting-prune-history"] = {
            "task": "controlplane.alerting.tasks.history_prune_task", "schedule": 3600.0,
            "options": {"queue": "control", "expires": 3600.0},
        }
        app.conf.beat_schedule = schedule

    if app.configured:
        add()
    app.on_after_configure.connect(add, weak=False)
