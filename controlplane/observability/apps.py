from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Scraping, storage (each worker's, pool's and gateway revision's series), the query API and the control
    plane's own /metrics."""

    name = "controlplane.observability"
    label = "observability"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.conf import settings

        from controlplane.celery import schedule_periodic

        interval, shards = float(settings.TANDEM_SCRAPE_INTERVAL_S), settings.TANDEM_SCRAPE_SHARDS
        # One pass per shard each interval (the fleet's deployments split by id), so that several periodic workers
        # share the scrape of a large fleet; one shard, one pass of everything, as before.
        scrape = ({"observability-scrape": ("observability.scrape_cycle", interval)} if shards == 1 else
                  {f"observability-scrape-{i}": ("observability.scrape_cycle", interval, {"shard": i, "shards": shards})
                   for i in range(shards)})
        schedule_periodic({**scrape, "observability-rollup": ("observability.rollup_and_prune", 60.0)})
