"""1-minute rollups of the raw samples, and retention (raw 6 h, rollups 14 days by default; settings).

Run every minute by the `observability.rollup_and_prune` task. Each pass rolls up every complete minute since the
last rolled-up one (at most `MAX_MINUTES_PER_PASS`, so a long outage catches up over several passes without one huge
transaction), then deletes what is past retention. A minute counts as complete once a scrape interval plus a margin
has passed after its end, so a slow cycle's late samples still land in their minute.
"""
from __future__ import annotations

import math
import time

from django.conf import settings
from django.db import transaction
from django.db.models import Avg, Count, F, Max, Min
from django.db.models.functions import Floor

from controlplane.observability.models import GatewayCounters, RevisionSample, Rollup, Sample, ScrapeState, TenantSample
from controlplane.tenants.usage import prune_usage

MAX_MINUTES_PER_PASS = 120
_LATE_MARGIN_S = 5.0


def rollup_pending(*, now: float | None = None) -> int:
    """Roll up complete minutes not rolled up yet; returns the number of rollup rows written."""
    now = time.time() if now is None else now
    end = math.floor((now - settings.TANDEM_SCRAPE_INTERVAL_S - _LATE_MARGIN_S) / 60) * 60
    latest = Rollup.objects.order_by("-ts").values_list("ts", flat=True).first()
    # Minutes already past raw retention have no samples left to roll up.
    candidate = math.floor((now - settings.TANDEM_METRICS_RAW_RETENTION_S) / 60) * 60
    if latest is not None:
        candidate = max(candidate, latest + 60)
    # Start at the first sample not rolled up yet, so that a gap with no samples (nothing deployed) is skipped.
    first = Sample.objects.filter(ts__gte=candidate).order_by("ts").values_list("ts", flat=True).first()
    if first is None:
        return 0
    start = math.floor(first / 60) * 60
    end = min(end, start + 60 * MAX_MINUTES_PER_PASS)
    if end <= start:
        return 0
    groups = (Sample.objects.filter(ts__gte=start, ts__lt=end)
              .annotate(minute=Floor(F("ts") / 60) * 60)
              .values("minute", "deployment_id", "role", "worker_id", "metric")
              .annotate(avg=Avg("value"), min=Min("value"), max=Max("value"), count=Count("id"))
              .order_by())
    rows = [Rollup(ts=float(g["minute"]), deployment_id=g["deployment_id"], role=g["role"],
                   worker_id=g["worker_id"], metric=g["metric"], avg=g["avg"], min=g["min"], max=g["max"],
                   count=g["count"]) for g in groups]
    with transaction.atomic():
        # Delete-then-insert makes a pass that runs twice (two beat messages, a retry) write each minute once.
        Rollup.objects.filter(ts__gte=start, ts__lt=end).delete()
        Rollup.objects.bulk_create(rows, batch_size=2000)
    return len(rows)


def prune(*, now: float | None = None) -> dict[str, int]:
    """Delete samples (a revision's, a tenant's and a gateway's counters as a worker's) and rollups past retention,
    and the scrape state of targets silent for a whole window of raw retention (workers long gone). Returns the
    number of rows deleted per table."""
    now = time.time() if now is None else now
    raw_cutoff = now - settings.TANDEM_METRICS_RAW_RETENTION_S
    # No relations or signals point at these models, so Django deletes with one DELETE ... WHERE (no fetch).
    num_samples, _ = Sample.objects.filter(ts__lt=raw_cutoff).delete()
    num_revision_samples, _ = RevisionSample.objects.filter(ts__lt=raw_cutoff).delete()
    num_tenant_samples, _ = TenantSample.objects.filter(ts__lt=raw_cutoff).delete()
    num_gateway_counters, _ = GatewayCounters.objects.filter(ts__lt=raw_cutoff).delete()
    num_rollups, _ = Rollup.objects.filter(ts__lt=now - settings.TANDEM_METRICS_ROLLUP_RETENTION_S).delete()
    num_states, _ = ScrapeState.objects.filter(last_scrape_at__lt=raw_cutoff).delete()
    return {"samples": num_samples, "revision_samples": num_revision_samples,
            "tenant_samples": num_tenant_samples, "gateway_counters": num_gateway_counters, "rollups": num_rollups,
            "scrape_states": num_states, "tenant_usage": prune_usage(now=now)}
