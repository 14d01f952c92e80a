"""One scrape cycle: find the targets, scrape them, derive the series, store samples and the per-target state.

Any Celery process may run a cycle: the raw counters a rate needs live in ScrapeState rows, not in memory.
Two cycles that overlap (a slow cycle and the next beat) each append a snapshot to the state they read; the later
write wins, so one snapshot may be lost. Rates stay correct (each snapshot carries its own timestamp); the window
just has one point fewer.
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F, Q
from django.db.models.functions import Mod

from controlplane.models import Pool
from controlplane.observability.catalog import METRIC_IDS, POOL_AGGREGATES, SCRAPED_STATUSES, PoolAggregate
from controlplane.observability.derive import Increments, pool_increments, rate_series, state_append, target_series
from controlplane.observability.gateway_counters import counter_rows
from controlplane.observability.models import GatewayCounters, RevisionSample, Sample, ScrapeState, TenantSample
from controlplane.observability.scraper import Fetched, Target, scrape
from controlplane.observability.tenant_rates import tenant_increments, tenant_states, tenant_values
from controlplane.tenants.usage import add_usage, counter_deltas, usage_rows
from inference.engines import ENGINES, TANDEM


@dataclass(frozen=True, slots=True)
class CycleResult:
    ts: float
    num_targets: int
    num_up: int
    num_samples: int
    scrape_seconds: float
    store_seconds: float


@dataclass(frozen=True, slots=True)
class Shard:
    """The deployments one pass scrapes: those whose id modulo `of` is `index` (settings.TANDEM_SCRAPE_SHARDS).
    By deployment, so that a pool's workers, and its aggregate series, are all in one pass."""
    index: int = 0
    of: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.of:
            raise ValueError(f"shard {self.index} of {self.of}: a shard is a number from 0 to {self.of - 1}")

    def filter(self, rows, field: str = "deployment_id"):
        if self.of == 1:
            return rows
        return rows.annotate(_shard=Mod(field, self.of)).filter(_shard=self.index)


ALL = Shard()


def scrape_targets(shard: Shard = ALL) -> list[Target]:
    """Workers and gateways that hold a process with a known port (a profile run's workers are not the
    deployment's: their load would read as its traffic). A starting worker of another engine than Tandem's is not
    one yet: vLLM listens only once it has loaded and compiled, and a minute of `up` 0 while it does would read as
    a worker down (the health pass holds it to its start deadline meanwhile). A shared gateway's process is one
    target per deployment attached to it (shared_gateway_targets)."""
    from controlplane.models import Worker, WorkerPurpose, WorkerStatus

    rows = (shard.filter(Worker.objects.filter(status__in=SCRAPED_STATUSES, port__isnull=False,
                                               purpose=WorkerPurpose.SERVING, deployment__isnull=False))
            # A subquery: an exclude on the JSON key alone would drop Tandem's starting workers too (the key is
            # absent there, and NOT (NULL IN ...) is NULL, not true).
            .exclude(id__in=Worker.objects.filter(
                status=WorkerStatus.STARTING,
                revision__engine_settings__common__engine__in=[e for e in ENGINES if e != TANDEM]).values("id"))
            .values_list("id", "deployment_id", "role", "host", "port"))
    return ([Target(wid, dep, role, f"http://{host}:{port}") for wid, dep, role, host, port in rows]
            + shared_gateway_targets(shard))


def shared_gateway_targets(shard: Shard = ALL, *, failed: bool = False) -> list[Target]:
    """One target per (shared gateway process, deployment attached to it), carrying the deployment's model (its
    name: what the gateway labels its series with), so that each deployment reads its own part of the one page and
    keeps a scrape state of its own. In the shard of the deployment, as any other gateway. `failed`: the processes
    supervision gave up restarting (no page; up=0 for each deployment), else those with a process to scrape."""
    from controlplane.models import Deployment, Worker, WorkerPurpose, WorkerStatus

    rows = Worker.objects.filter(purpose=WorkerPurpose.SERVING, shared_gateway__isnull=False)
    rows = (rows.filter(status=WorkerStatus.FAILED) if failed
            else rows.filter(status__in=SCRAPED_STATUSES, port__isnull=False))
    processes: dict[int, list[tuple]] = defaultdict(list)
    for wid, gateway_id, role, host, port in rows.values_list("id", "shared_gateway_id", "role", "host", "port"):
        processes[gateway_id].append((wid, role, "" if failed else f"http://{host}:{port}"))
    if not processes:
        return []
    attached = (shard.filter(Deployment.objects.filter(shared_gateway_id__in=list(processes)), field="id")
                .values_list("id", "name", "shared_gateway_id").order_by("id"))
    return [Target(wid, deployment_id, role, url, model=name)
            for deployment_id, name, gateway_id in attached for wid, role, url in processes[gateway_id]]


def failed_targets(shard: Shard = ALL) -> list[Target]:
    """Failed workers that still hold their slot: a gateway, or a pool worker of its deployment's current revision
    (reconcile keeps both until an operator restarts, scales or replaces them). They have no process to scrape,
    and they are down: each cycle records up=0 for them, so that "worker down" keeps firing until the worker is
    ready again, stopped, or replaced by a rollout (a failed worker of an older revision holds no slot)."""
    from controlplane.models import Worker, WorkerPurpose, WorkerRole, WorkerStatus

    rows = (shard.filter(Worker.objects.filter(status=WorkerStatus.FAILED, purpose=WorkerPurpose.SERVING,
                                               deployment__isnull=False))
            .filter(Q(role=WorkerRole.GATEWAY) | Q(revision_id=F("deployment__current_revision_id")))
            .values_list("id", "deployment_id", "role"))
    return ([Target(wid, dep, role, "") for wid, dep, role in rows]
            + shared_gateway_targets(shard, failed=True))


def scrape_cycle(*, targets: list[Target] | None = None, now: float | None = None, shard: Shard = ALL) -> CycleResult:
    """1. scrape every target (of the shard's deployments) concurrently (failed workers count as targets that did
    not answer); 2. derive each target's series from its snapshots in the window (a gateway's per revision and per
    tenant too); 3. aggregate per (deployment, role), and per (deployment, tenant) over its gateways (tenant_rates);
    4. write samples, each gateway's counters as scraped (gateway_counters.py) and states in one short transaction."""
    down: list[Target] = []
    if targets is None:
        targets, down = scrape_targets(shard), failed_targets(shard)
    started = time.perf_counter()
    fetched = scrape(targets, timeout_s=settings.TANDEM_SCRAPE_TIMEOUT_S,
                     concurrency=settings.TANDEM_SCRAPE_CONCURRENCY)
    fetched += [Fetched(target, None, "the worker failed: no process (supervision gave up restarting it)", 0.0)
                for target in down]
    scraped = time.perf_counter()
    ts = time.time() if now is None else now
    num_samples, num_up = _store(fetched, ts, shard)
    return CycleResult(ts=ts, num_targets=len(fetched), num_up=num_up, num_samples=num_samples,
                       scrape_seconds=scraped - started, store_seconds=time.perf_counter() - scraped)


def _store(fetched: list[Fetched], ts: float, shard: Shard) -> tuple[int, int]:
    window = settings.TANDEM_SCRAPE_WINDOW_S
    # values_list, not model instances: the states of 1,000 targets are read and written every cycle.
    # By (worker, deployment): a shared gateway's process holds one state per deployment it serves.
    states = {(wid, dep): snapshots for wid, dep, snapshots in
              ScrapeState.objects.filter(worker_id__in=[f.target.worker_id for f in fetched])
              .values_list("worker_id", "deployment_id", "snapshots")}
    rows: list[tuple] = []
    pools: dict[tuple[int, str], list[tuple[dict, Increments | None]]] = defaultdict(list)
    pool_up: dict[tuple[int, str], list[float]] = defaultdict(list)
    new_states: list[tuple] = []
    revision_rows: list[RevisionSample] = []
    usage: list[tuple] = []
    gateways: list[tuple] = []  # (worker id, deployment id, reading) of each gateway that answered
    # deployment → tenant → (its increments, its limits) at each of the deployment's gateways
    tenant_parts: dict[int, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    num_up = 0
    for item in fetched:
        target = item.target
        state = states.get((target.worker_id, target.deployment_id)) or None
        key = (target.deployment_id, target.role)
        if item.reading is None:
            values = {"up": 0.0}
            error = item.error
        else:
            num_up += 1
            by_revision = (state or {}).get("rev") or {}
            tenants_before = (state or {}).get("tenants")
            tenant_rings = (state or {}).get("tenant_rings")
            state = state_append(state, item.reading, ts, window)
            if target.role == "gateway":  # what each tenant used since the last scrape (a bill's rows)
                gateways.append((target.worker_id, target.deployment_id, item.reading))
                state["tenants"], growth = counter_deltas(tenants_before, item.reading.by_tenant,
                                                          item.reading.started_at, ts)
                usage.extend(usage_rows(ts, target.deployment_id, growth))
                state["tenant_rings"] = tenant_states(tenant_rings, item.reading, ts, window)
                for tenant, tenant_state in state["tenant_rings"].items():
                    inc = tenant_increments(tenant_state)
                    if inc is not None:
                        tenant_parts[target.deployment_id][tenant].append(
                            (inc, item.reading.tenant_limits.get(tenant, {})))
            values, inc = target_series(state, item.reading.gauges)
            pools[key].append((values, inc))
            error = ""
            if item.reading.by_revision:
                state["rev"] = _revision_states(by_revision, item.reading, ts, window)
                revision_rows.extend(_revision_rows(ts, target.deployment_id, state["rev"]))
        pool_up[key].append(values["up"])
        rows.extend(_rows(ts, target.deployment_id, target.role, target.worker_id, values))
        new_states.append((target.worker_id, target.deployment_id, target.role, json.dumps(state or {}), ts,
                           item.reading is not None, error[:2000]))
    for key, ups in pool_up.items():
        values = _pool_values(pools.get(key, []))
        values["up"] = sum(ups) / len(ups)
        rows.extend(_rows(ts, key[0], key[1], None, values))
    # The control plane's own view of each pool: how many of its workers no node can take (an alert rule's input).
    for deployment_id, role, num in shard.filter(Pool.objects.all()).values_list("deployment_id", "role",
                                                                                   "unschedulable_replicas"):
        rows.append((ts, deployment_id, role, None, METRIC_IDS["unschedulable_replicas"], float(num)))
    tenant_rows = [(ts, deployment_id, tenant, METRIC_IDS[name], value)
                   for deployment_id, tenants in tenant_parts.items() for tenant, parts in tenants.items()
                   for name, value in tenant_values(parts).items()]
    with transaction.atomic():
        _insert_samples(rows)
        RevisionSample.objects.bulk_create(revision_rows, batch_size=500)
        GatewayCounters.objects.bulk_create(counter_rows(ts, gateways), batch_size=500)
        _insert_tenant_samples(tenant_rows)
        _upsert_states(new_states)
        add_usage(usage)  # in the states' transaction: a growth is added once, with the counters it was read from
    return len(rows), num_up


def _upsert_states(states: list[tuple]) -> None:
    """Insert or replace each target's state, one per (worker, deployment): one executemany of INSERT ... ON
    CONFLICT (PostgreSQL, SQLite 3.24+). Not bulk_create: on PostgreSQL it sends its rows as arrays (UNNEST), and escaping each snapshot's JSON text as
    an array element cost more than the rest of the write; here the JSON goes as
    one text parameter, which the jsonb (or SQLite text) column takes as it is."""
    quote = connection.ops.quote_name
    table = quote(ScrapeState._meta.db_table)
    columns = ["worker_id", "deployment_id", "role", "snapshots", "last_scrape_at", "last_up", "last_error"]
    updates = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in columns[2:])
    with connection.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {table} ({', '.join(map(quote, columns))}) VALUES ({', '.join(['%s'] * len(columns))}) "
            f"ON CONFLICT ({quote('worker_id')}, {quote('deployment_id')}) DO UPDATE SET {updates}", states)


def _revision_states(previous: dict, reading, ts: float, window: float) -> dict:
    """The per-revision rings of a gateway (its request metrics split by their `revision` label), each appended
    like a target's own; a revision the gateway no longer reports is dropped."""
    return {revision: state_append(previous.get(revision), part, ts, window)
            for revision, part in reading.by_revision.items() if revision.isdigit() and len(revision) < 10}


def _revision_rows(ts: float, deployment_id: int, states: dict) -> list[RevisionSample]:
    """Rates, ratios and latency quantiles of each revision the gateway served (no gauges: a gateway's gauges are
    not per revision)."""
    rows = []
    for revision, state in states.items():
        values, _ = target_series(state, {})
        rows.extend(RevisionSample(ts=ts, deployment_id=deployment_id, revision=int(revision),
                                   metric=METRIC_IDS[name], value=value)
                    for name, value in values.items() if name != "up" and value is not None)
    return rows


def _rows(ts, deployment_id, role, worker_id, values: dict) -> list[tuple]:
    return [(ts, deployment_id, role, worker_id, METRIC_IDS[name], value)
            for name, value in values.items() if value is not None]


def _insert_samples(rows: list[tuple]) -> None:
    """All rows in one statement. PostgreSQL: COPY, many times faster than executemany for the ~30,000 rows of a
    1,000-target cycle, since each row is one line of text, not a bound statement. Elsewhere one executemany: many
    times faster than bulk_create, no model instances (docs/performance.md, 'Control plane benches')."""
    table = connection.ops.quote_name(Sample._meta.db_table)
    columns = "ts, deployment_id, role, worker_id, metric, value"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
            return
        cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s, %s, %s)", rows)


def _insert_tenant_samples(rows: list[tuple]) -> None:
    if not rows:
        return
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.executemany(f"INSERT INTO {quote(TenantSample._meta.db_table)} (ts, deployment_id, tenant, metric, "
                           "value) VALUES (%s, %s, %s, %s, %s)", rows)


def _pool_values(workers: list[tuple[dict, Increments | None]]) -> dict[str, float | None]:
    """The pool aggregate of the workers that answered (catalog.PoolAggregate says how each series combines)."""
    increments = [inc for _, inc in workers if inc is not None]
    pooled = rate_series(pool_increments(increments)) if increments else {}
    values: dict[str, float | None] = {}
    for name, how in POOL_AGGREGATES.items():
        if how in (PoolAggregate.HISTOGRAM, PoolAggregate.COUNTER_RATIO):
            if name in pooled:
                values[name] = pooled[name]
            continue
        parts = [v[name] for v, _ in workers if v.get(name) is not None]
        if not parts:
            continue
        if how is PoolAggregate.SUM:
            values[name] = sum(parts)
        elif how is PoolAggregate.MEAN:
            values[name] = sum(parts) / len(parts)
        else:
            values[name] = max(parts)
    return values


def gateway_target(deployment_id: int) -> Target | None:
    """The gateway that serves the deployment, as the readers take it: its own (starting or ready, the newest), else
    the process of the shared gateway it is attached to, reading the deployment's model's part of the page. None
    when neither has a process with a port."""
    from controlplane.models import Deployment, Worker, WorkerRole, WorkerStatus

    live = dict(role=WorkerRole.GATEWAY, port__isnull=False, status__in=(WorkerStatus.STARTING, WorkerStatus.READY))
    own = Worker.objects.filter(deployment_id=deployment_id, **live).order_by("-id").first()
    if own is not None:
        return Target(own.id, deployment_id, own.role, own.url)
    row = Deployment.objects.filter(pk=deployment_id).values_list("name", "shared_gateway_id").first()
    if row is None or row[1] is None:
        return None
    shared = Worker.objects.filter(shared_gateway_id=row[1], **live).order_by("-id").first()
    return None if shared is None else Target(shared.id, deployment_id, shared.role, shared.url, model=row[0])
