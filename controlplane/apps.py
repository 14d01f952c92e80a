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
