"""Observability storage: scraped samples (per worker and pool, and per revision of a gateway), their 1-minute
rollups, the scraper's per-target state, and cycle statistics for the control plane's own /metrics.

Volume drove the shape. One row per (target, scrape, metric) with a small-integer metric id and a float Unix
timestamp: 10 workers × ~25 series every 5 s is ~180,000 rows an hour, so each row stays ~40 bytes plus its index
entry, and a series read is one index range scan. Deployment and worker are plain integer columns rather than
foreign keys: samples outlive the workers they describe (history of a replaced worker stays readable) and deleting a
deployment must not cascade over a million rows inside the delete's transaction — retention prunes them.
"""
from __future__ import annotations

from django.db import models


class Sample(models.Model):
    """One value of one derived series at one scrape. `worker_id` None = the pool aggregate of (deployment, role)."""

    ts = models.FloatField()  # Unix seconds of the scrape
    deployment_id = models.BigIntegerField()
    role = models.CharField(max_length=12)
    worker_id = models.BigIntegerField(null=True)
    metric = models.PositiveSmallIntegerField()  # catalog.METRIC_IDS
    value = models.FloatField()

    class Meta:
        indexes = [
            # Read by the query API and the selectors (one metric of one deployment over a time range; with role
            # and worker as further prefix columns for pool and per-worker series). `value` is carried in the index
            # (PostgreSQL; other databases ignore `include`) so that a series read is an index-only scan: rows are
            # written a scrape at a time for the whole fleet, so one series' rows lie one per heap page, and a read
            # of a few thousand of them would otherwise touch a few thousand pages.
            models.Index(fields=["deployment_id", "metric", "role", "worker_id", "ts"], name="sample_series_cover",
                         include=["value"]),
            # Read by retention pruning and the rollup (a time range across all series).
            models.Index(fields=["ts"], name="sample_ts"),
        ]


class Rollup(models.Model):
    """The samples of one series over one minute [ts, ts + 60): avg, min, max, count."""

    ts = models.FloatField()  # start of the minute, Unix seconds (a multiple of 60)
    deployment_id = models.BigIntegerField()
    role = models.CharField(max_length=12)
    worker_id = models.BigIntegerField(null=True)
    metric = models.PositiveSmallIntegerField()
    avg = models.FloatField()
    min = models.FloatField()
    max = models.FloatField()
    count = models.PositiveIntegerField()

    class Meta:
        indexes = [
            # As sample_series, carrying every column a read aggregates (the rollups are written a minute at a time
            # for the whole fleet): a day of one per-worker chart is then an index-only scan.
            models.Index(fields=["deployment_id", "metric", "role", "worker_id", "ts"], name="rollup_series_cover",
                         include=["avg", "min", "max", "count"]),
            models.Index(fields=["ts"], name="rollup_ts"),
        ]


class RevisionSample(models.Model):
    """One value of one request series of a deployment's gateway, for the requests one revision served, at one
    scrape: the gateway labels its request metrics with the serving revision, and the scrape cycle derives each
    revision's series like a worker's (store.py). Workers' own series need no such row: each is attributed to a
    revision through its Worker row. Read by the rollout page's overlaid charts; pruned with raw samples' retention
    (rollup.prune). The table keeps the name the rollouts app gave it when it held this model."""

    ts = models.FloatField()  # Unix seconds of the scrape
    deployment_id = models.BigIntegerField()
    revision = models.PositiveIntegerField()
    metric = models.PositiveSmallIntegerField()  # catalog.METRIC_IDS
    value = models.FloatField()

    class Meta:
        db_table = "rollouts_revisionsample"
        indexes = [
            # Read by the rollout page: one deployment's revisions over the rollout's time range.
            models.Index(fields=["deployment_id", "revision", "metric", "ts"], name="revision_sample_series"),
            # Read by retention pruning.
            models.Index(fields=["ts"], name="revision_sample_ts"),
        ]


class TenantSample(models.Model):
    """One value of one series of one tenant of a deployment (pooled over its gateways) at one scrape
    (observability/tenant_rates.py). By name, as TenantUsage: the rows outlive a deleted tenant, and callers of an
    open deployment without a key are `_anonymous`. Written only for a tenant that used the deployment in the rate
    window; read by the tenant page's charts and by alert rules scoped to a tenant; pruned with raw samples'
    retention (rollup.prune), never rolled up."""

    ts = models.FloatField()  # Unix seconds of the scrape
    deployment_id = models.BigIntegerField()
    tenant = models.CharField(max_length=63)
    metric = models.PositiveSmallIntegerField()  # catalog.METRIC_IDS (catalog.TENANT_METRICS)
    value = models.FloatField()

    class Meta:
        indexes = [
            # Read by the tenant page (one tenant, its metrics, every deployment, a time range) and by rules scoped
            # to a tenant (one tenant and metric over a window), as index range scans.
            models.Index(fields=["tenant", "metric", "deployment_id", "ts"], name="tenant_sample_series",
                         include=["value"]),
            # Read by retention pruning.
            models.Index(fields=["ts"], name="tenant_sample_ts"),
        ]


class GatewayCounters(models.Model):
    """A gateway's cumulative request counters and latency histograms at one scrape that it answered, summed over
    revisions (gateway_counters.py has the format). The derived series are rates over the scrape window, too long
    for a fault of a few seconds: a window of any length is read as the increase between two of these rows, as
    Prometheus' raw samples are read in the other backend. Pruned with raw samples' retention (rollup.prune)."""

    ts = models.FloatField()  # Unix seconds of the scrape
    deployment_id = models.BigIntegerField()
    worker_id = models.BigIntegerField()  # the gateway's Worker row
    snapshot = models.JSONField(default=dict)

    class Meta:
        indexes = [
            # Read by gateway_counters.stored_counters: one gateway's scrapes over a window.
            models.Index(fields=["worker_id", "ts"], name="gateway_counters_window"),
            # Read by retention pruning.
            models.Index(fields=["ts"], name="gateway_counters_ts"),
        ]


class ScrapeState(models.Model):
    """The recent raw counters and histogram buckets of one target, so that any Celery process can compute rates.

    `snapshots`: {"le": bucket bounds per histogram, "ring": the snapshots of the rate window, oldest first} (format
    in derive.py). The target is a Worker row (workers and gateways alike) and the deployment whose series it holds:
    one per worker, but one per attached deployment for a shared gateway's process, whose page holds each one's
    series (store.shared_gateway_targets).
    """

    worker_id = models.BigIntegerField()
    deployment_id = models.BigIntegerField()
    role = models.CharField(max_length=12)
    snapshots = models.JSONField(default=dict)
    last_scrape_at = models.FloatField(null=True)
    last_up = models.BooleanField(default=False)
    last_error = models.TextField(blank=True)

    class Meta:
        constraints = [
            # The conflict target of the scrape's upsert (store._upsert_states).
            models.UniqueConstraint(fields=["worker_id", "deployment_id"], name="scrape_state_per_target"),
        ]


class CycleKind(models.TextChoices):
    SCRAPE = "scrape"
    AUTOSCALE = "autoscale"
    ALERT_EVALUATION = "alert_evaluation"
    ROLLUP = "rollup"
    RECONCILE = "reconcile"
    HEALTH = "health"


class CycleStat(models.Model):
    """A cumulative histogram of one kind of periodic work's duration, kept in the DB because the scraper and the
    evaluators run in Celery processes while /metrics is served by the web process."""

    kind = models.CharField(max_length=32, unique=True)
    count = models.PositiveBigIntegerField(default=0)
    sum_seconds = models.FloatField(default=0.0)
    buckets = models.JSONField(default=list)  # cumulative counts, aligned with telemetry.DURATION_BUCKETS
    last_seconds = models.FloatField(null=True)
    last_at = models.DateTimeField(null=True)
    last_targets = models.PositiveIntegerField(null=True)  # scrape: targets scraped in the last cycle
    last_targets_up = models.PositiveIntegerField(null=True)
    # scrape split in shards: {"of": N, "parts": {"i": [targets, up]}}, the latest pass of each; {} with one shard
    shard_targets = models.JSONField(default=dict)
