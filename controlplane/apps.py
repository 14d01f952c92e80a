from django.apps import AppConfig


class ControlPlaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Tandem control plane"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The role groups exist in every database, including each test database (created after migrate).
        from django.db.models.signals import post_migrate

        from controlplane.auth import ensure_role_groups

        post_migrate.connect(ensure_role_groups, sender=self)
        # Register the tasks of both queues in every process, so that controlplane.celery.task_send finds them
        # by name (the web process never runs Celery's autodiscovery).
        from controlplane.agent import tasks as agent_tasks  # noqa: F401
        from controlplane.supervision import tasks as supervision_tasks  # noqa: F401
