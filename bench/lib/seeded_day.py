"""A day of one deployment's series in the SQL store, as a day of scraping leaves it under the default retention:
the last 6 h as raw 5-second samples (rolled up by the observability app's own `rollup_pending`), the 18 h before as
1-minute rollups; each series a smooth daily curve plus a faster wiggle (`value_at`). Seeded by
bench/controlplane/dashboard_page.py and bench/lib/fleet_measure.py before they time the pages."""
from __future__ import annotations

import math
import time

STEP_S = 5.0
DAY_S = 24 * 3600


def value_at(metric_id: int, series_index: int, ts: float) -> float:
    # A smooth daily curve plus a faster wiggle, different per series: cheap and deterministic.
    phase = (metric_id * 7 + series_index * 13) % 100 / 100.0
    return 0.5 + 0.3 * math.sin(2 * math.pi * (ts / DAY_S + phase)) + 0.1 * math.sin(ts / 300.0 + phase * 6)


def seed(deployment, workers, now: float) -> dict:
    from django.conf import settings

    from controlplane.observability.catalog import METRIC_IDS
    from controlplane.observability.models import Rollup, Sample
    from controlplane.observability.rollup import rollup_pending

    series = [(w.role, w.pk) for w in workers] + [(role, None) for role in ("prefill", "decode", "gateway")]
    raw_from = now - settings.TANDEM_METRICS_RAW_RETENTION_S
    started = time.perf_counter()
    num_samples = 0
    ts = raw_from
    batch: list = []
    while ts <= now:
        for index, (role, worker_id) in enumerate(series):
            for metric_id in METRIC_IDS.values():
                batch.append(Sample(ts=ts, deployment_id=deployment.pk, role=role, worker_id=worker_id,
                                    metric=metric_id, value=value_at(metric_id, index, ts)))
        if len(batch) >= 20_000:
            Sample.objects.bulk_create(batch, batch_size=5000)
            num_samples += len(batch)
            batch = []
        ts += STEP_S
    Sample.objects.bulk_create(batch, batch_size=5000)
    num_samples += len(batch)
    seeded_raw = time.perf_counter()
    num_rolled = 0
    while True:  # rollup, as the periodic task runs it (at most 120 minutes per pass)
        written = rollup_pending(now=now)
        if not written:
            break
        num_rolled += written
    rolled = time.perf_counter()
    # The 18 h before raw retention: the rollups those samples became before pruning.
    per_minute = int(60 / STEP_S)
    minute = math.floor((now - DAY_S) / 60) * 60
    batch = []
    num_old = 0
    while minute < math.floor(raw_from / 60) * 60:
        for index, (role, worker_id) in enumerate(series):
            for metric_id in METRIC_IDS.values():
                values = [value_at(metric_id, index, minute + i * STEP_S) for i in range(per_minute)]
                batch.append(Rollup(ts=float(minute), deployment_id=deployment.pk, role=role, worker_id=worker_id,
                                    metric=metric_id, avg=sum(values) / per_minute, min=min(values),
                                    max=max(values), count=per_minute))
        if len(batch) >= 20_000:
            Rollup.objects.bulk_create(batch, batch_size=5000)
            num_old += len(batch)
            batch = []
        minute += 60
    Rollup.objects.bulk_create(batch, batch_size=5000)
    num_old += len(batch)
    return {"num_series": len(series) * len(METRIC_IDS), "num_raw_samples": num_samples,
            "num_rollups_from_raw": num_rolled, "num_older_rollups": num_old,
            "seed_raw_s": round(seeded_raw - started, 1), "rollup_s": round(rolled - seeded_raw, 1),
            "seed_old_rollups_s": round(time.perf_counter() - rolled, 1)}


def settle_tables() -> dict:
    """VACUUM ANALYZE the series tables (PostgreSQL), as autovacuum leaves a day of data: a day-old page is
    all-visible (so index-only scans skip the heap) and the planner knows the tables' sizes. Timing right after
    writing millions of rows would otherwise measure the minute before autovacuum gets to them."""
    from django.db import connection

    from controlplane.observability.models import Rollup, Sample

    if connection.vendor != "postgresql":
        return {}
    started = time.perf_counter()
    with connection.cursor() as cursor:
        for model in (Sample, Rollup):
            cursor.execute(f"VACUUM ANALYZE {model._meta.db_table}")
    return {"vacuum_analyze_s": round(time.perf_counter() - started, 1)}
