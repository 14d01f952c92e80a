import os

from django.apps import AppConfig


class ControlPlaneConfig(AppConfig):
    name = "controlplane"
    verbose_name = "Tandem control plane"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The role groups exist in every database, including each test database (created after migrate).
        from django.db.backends.signals import connection_created
        from django.db.models.signals import post_migrate

        from controlplane.auth import ensure_role_groups

        post_migrate.connect(ensure_role_groups, sender=self)
        connection_created.connect(_private_sqlite_files, dispatch_uid="tandem-private-sqlite")
        # Register the tasks of both queues in every process, so that controlplane.celery.task_send finds them
        # by name (the web process never runs Celery's autodiscovery).
        from controlplane.agent import tasks as agent_tasks  # noqa: F401
        from controlplane.supervision import tasks as supervision_tasks  # noqa: F401


def _private_sqlite_files(sender, connection, **kwargs) -> None:
    """The SQLite database holds sessions, token hashes and signing secrets: 0600, with its WAL and shared-memory
    files (SQLite creates them with the process umask)."""
    if connection.vendor != "sqlite":
        return
    name = str(connection.settings_dict.get("NAME") or "")
    if not name or name == ":memory:" or name.startswith("file:"):
        return
    for path in (name, f"{name}-wal", f"{name}-shm"):
        try:
            if os.stat(path).st_mode & 0o077:
                os.chmod(path, 0o600)
        except OSError:
            pass  # not created yet (the next connection sees it), or not ours
