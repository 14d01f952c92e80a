from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Scraping, storage, the query API and the control plane's own /metrics. Its models include the autoscaler's
    policy table (the autoscaler's code is controlplane.autoscaling)."""

    name = "controlplane.observability"
    label = "observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from controlplane.celery import schedule_periodic

        schedule_periodic({
            "observability-scrape": ("observability.scrape_cycle", float(settings.TANDEM_SCRAPE_INTERVAL_S)),
            "observability-rollup": ("observability.rollup_and_prune", 60.0),
        })
