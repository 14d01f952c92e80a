from django.apps import AppConfig


class ReplayConfig(AppConfig):
    """Recorded and imported request traces, and replays of a deployment on them before a change."""

    name = "controlplane.replay"
    label = "replay"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from controlplane import change_gate
        from controlplane.celery import schedule_periodic
        from controlplane.replay import gate, tasks  # noqa: F401  (tasks: registers the trace pull)

        change_gate.provide(gate.check)

        schedule_periodic({"replay-pull-traces": ("replay.pull_traces", float(settings.TANDEM_TRACE_PULL_INTERVAL_S))})
