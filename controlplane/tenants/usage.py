"""Usage you can bill: a gateway's cumulative per-tenant counters, scraped with its /metrics, turned into hourly rows
per (tenant, deployment, hour) (TenantUsage).

Each scrape adds to the hour it ran in what every counter grew by since the gateway's previous scrape; the
counters last read are kept in the gateway's scrape state (ScrapeState.snapshots["tenants"]), written in the same
transaction as the rows, so a pass adds a growth exactly once. A gateway restarted in place starts its counters from
0: a counter below its last reading, or a new process start time, means the gateway restarted, and the whole new
value is usage (what it served between its last scrape and the restart is lost, as in Prometheus' increase()). A
gateway seen for the first time (or again after its scrape state was pruned) counts from 0 when its process started
within FRESH_START_S (a new gateway), else its first reading is only the baseline (what it served before was
stored already, or was served before the control plane kept usage): never counted twice. Passes of one shard never
overlap (the scrape task's single_pass); two that did would both add the same growth.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone as dt_timezone

from django.conf import settings
from django.db import connection
from django.db.models import Sum
from django.utils import timezone

from controlplane.tenants.models import USAGE_FIELDS, TenantUsage

FRESH_START_S = 600.0
HOUR_S = 3600


def counter_deltas(previous: dict | None, tenants: dict[str, dict[str, float]], started_at: float | None,
                   ts: float) -> tuple[dict, dict[str, dict[str, int]]]:
    """(the state to keep, each tenant's growth since `previous`): `previous` is what the last call returned for the
    same gateway (None: first seen), `tenants` its counters now (Reading.by_tenant), `started_at` its process start
    time. Tenants without any growth are left out of the growth."""
    state = {"start": started_at, "c": {name: dict(values) for name, values in tenants.items()}}
    if previous is None:
        fresh = started_at is not None and ts - started_at <= FRESH_START_S
        return state, (_growth({}, tenants) if fresh else {})
    restarted = (started_at is not None and previous.get("start") is not None
                 and abs(started_at - previous["start"]) > 1e-3)
    # A tenant that disappeared from the page (left the membership) and comes back is new: counted from 0.
    return state, _growth({} if restarted else previous.get("c") or {}, tenants)


def _growth(before: dict, tenants: dict[str, dict[str, float]]) -> dict[str, dict[str, int]]:
    growth = {}
    for name, values in tenants.items():
        last = before.get(name, {})
        if any(values.get(key, 0.0) < last.get(key, 0.0) for key in USAGE_FIELDS):
            last = {}  # its counters went back: they restarted from 0 (a restart without a known start time)
        delta = {key: round(values.get(key, 0.0) - last.get(key, 0.0)) for key in USAGE_FIELDS}
        delta = {key: max(0, value) for key, value in delta.items()}
        if any(delta.values()):
            growth[name] = delta
    return growth


def hour_of(ts: float) -> datetime:
    return datetime.fromtimestamp(int(ts // HOUR_S) * HOUR_S, tz=dt_timezone.utc)


def usage_rows(ts: float, deployment_id: int, growth: dict[str, dict[str, int]]) -> list[tuple]:
    hour = hour_of(ts)
    return [(name[:63], deployment_id, hour, *(delta[key] for key in USAGE_FIELDS))
            for name, delta in growth.items()]


def add_usage(rows: list[tuple]) -> None:
    """Add each (tenant, deployment_id, hour, *USAGE_FIELDS) to its hour's row, created when missing: one
    executemany of INSERT ... ON CONFLICT DO UPDATE (PostgreSQL, SQLite 3.24+). Rows of one key are merged first
    (two gateways of a deployment)."""
    if not rows:
        return
    merged: dict[tuple, list[int]] = {}
    for tenant, deployment_id, hour, *values in rows:
        key = (tenant, deployment_id, hour)
        merged[key] = [a + b for a, b in zip(merged[key], values)] if key in merged else list(values)
    quote = connection.ops.quote_name
    table = quote(TenantUsage._meta.db_table)
    columns = ["tenant", "deployment_id", "hour", *USAGE_FIELDS]
    updates = ", ".join(f"{quote(c)} = {table}.{quote(c)} + excluded.{quote(c)}" for c in USAGE_FIELDS)
    conflict = ", ".join(map(quote, columns[:3]))
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} ({', '.join(map(quote, columns))}) VALUES ({', '.join(['%s'] * len(columns))}) "
            f"ON CONFLICT ({conflict}) DO UPDATE SET {updates}",
            [(*key, *values) for key, values in merged.items()])


def prune_usage(*, now: float) -> int:
    """Delete the hours past settings.TANDEM_TENANT_USAGE_RETENTION_S."""
    cutoff = hour_of(now - settings.TANDEM_TENANT_USAGE_RETENTION_S)
    num, _ = TenantUsage.objects.filter(hour__lt=cutoff).delete()
    return num


def usage_by_tenant(deployment, *, since: datetime | None = None) -> list[dict]:
    """Each tenant's usage of the deployment since `since` (default: the last 24 hours), most tokens first: one
    query."""
    since = since or timezone.now() - timedelta(hours=24)
    rows = (TenantUsage.objects.filter(deployment=deployment, hour__gte=hour_of(since.timestamp()))
            .values("tenant").annotate(**{key: Sum(key) for key in USAGE_FIELDS}).order_by())
    return sorted(rows, key=lambda r: (-(r["prompt_tokens"] + r["completion_tokens"]), r["tenant"]))
