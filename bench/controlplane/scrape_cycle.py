"""One scrape + autoscaler-evaluate cycle of the control plane over many simulated targets (goal ≤ 2 s at 1,000).

A separate server process (aiohttp) serves realistic exposition text on one path per target: the text a worker
renders (inference.metrics.TandemMetrics, the same code the workers run, with the process collector), and each
scrape of a path returns the next "generation" of it (more requests observed), so rates and quantiles have work to do.
The cycle is the production code path: scrape every target concurrently, parse, derive, write samples and
per-target state to the database, then one autoscaler evaluation of every pool (each deployment has autoscaling on).

Also measured: the dashboard's heaviest read, 24 h of one metric for 10 workers (per-worker series from 1-minute
rollups), against the dashboard's 300 ms goal.

    python bench/controlplane/scrape_cycle.py    # 100 and 1,000 targets, SQLite in a temporary folder
    python bench/controlplane/scrape_cycle.py --targets 1000 --cycles 5 --database-url postgres://127.0.0.1:5432/test
    python bench/controlplane/scrape_cycle.py --targets 1000 --compare --database-url postgres://127.0.0.1:5432/scratch

--compare: the cycle's store phase as it was before COPY (samples by one executemany, scrape states by
bulk_create's upsert, histogram increases matched bound by bound) against the current one (COPY on PostgreSQL,
one INSERT ... ON CONFLICT executemany, the ring's one bucket layout), alternating cycle by cycle on the same
targets, so both see the same machine.
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import emit, environment, setup_django  # noqa: E402

GOAL_S = 2.0
TARGETS_PER_DEPLOYMENT = 10  # 1 gateway, 3 prefill, 6 decode
NUM_GENERATIONS = 12

SERVER = r'''
import random, sys
from aiohttp import web
from prometheus_client import CollectorRegistry
from inference.metrics import TandemMetrics

num_generations = int(sys.argv[1])
texts = {}
for role in ("prefill", "decode", "gateway"):
    m = TandemMetrics(role=role, model="smollm2", registry=CollectorRegistry(), gpu=False)
    rng = random.Random(role)
    texts[role] = []
    for _ in range(num_generations):
        for _ in range(40):
            m.time_to_first_token.observe(rng.expovariate(4)); m.e2e_request_latency.observe(rng.expovariate(0.5))
            for _ in range(8):
                m.inter_token_latency.observe(rng.expovariate(40))
            m.count_success("stop"); m.prompt_tokens.inc(120); m.generation_tokens.inc(8)
        m.count_error("timeout"); m.requests_running.set(rng.randint(0, 16)); m.requests_waiting.set(rng.randint(0, 4))
        m.kv_cache_usage.set(rng.random())
        texts[role].append(m.render())
hits = {}

async def metrics(request):
    path = request.match_info["target"]
    n = hits[path] = hits.get(path, -1) + 1
    role = request.match_info["role"]
    return web.Response(body=texts[role][min(n, num_generations - 1)], content_type="text/plain")

app = web.Application()
app.router.add_get("/{role}/{target}/metrics", metrics)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), print=lambda *a: print("ready", flush=True),
            access_log=None)
'''


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--targets", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--cycles", type=int, default=4, help="timed cycles per size (after one warm-up cycle)")
    p.add_argument("--database-url", default=None, help="default: SQLite in a temporary folder")
    p.add_argument("--skip-query", action="store_true", help="skip the 24 h dashboard read")
    p.add_argument("--compare", action="store_true", help="the store phase before against now, alternating")
    return p.parse_args(argv)


def start_server(port: int) -> subprocess.Popen:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(NUM_GENERATIONS), str(port)], cwd=root,
                            stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(root)})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.stdout.readline().strip() == b"ready":
            return proc
        if proc.poll() is not None:
            raise SystemExit("the exposition server exited")
    proc.kill()
    raise SystemExit("the exposition server did not start within 60 s")


def make_fleet(num_targets: int, port: int, tag: str):
    """Deployments of 10 targets each (rows as supervision writes them) and the scrape targets for their paths."""
    from controlplane.models import Deployment, Node, Pool, Revision, Worker
    from controlplane.observability.scraper import Target

    node, _ = Node.objects.get_or_create(name="bench", defaults={"hostname": "localhost"})
    targets = []
    for d in range(num_targets // TARGETS_PER_DEPLOYMENT):
        deployment = Deployment.objects.create(name=f"{tag}-{d}", mode="disaggregated", autoscale_enabled=True)
        revision = Revision.objects.create(deployment=deployment, number=1, model_path="/models/x")
        pools = {role: Pool.objects.create(deployment=deployment, role=role, desired_replicas=n, min_replicas=1,
                                           max_replicas=16) for role, n in (("prefill", 3), ("decode", 6))}
        roles = ["gateway"] + ["prefill"] * 3 + ["decode"] * 6
        for role in roles:
            worker = Worker.objects.create(deployment=deployment, pool=pools.get(role), role=role, node=node,
                                           revision=None if role == "gateway" else revision, status="ready",
                                           port=port)
            targets.append(Target(worker.pk, deployment.pk, role,
                                  f"http://127.0.0.1:{port}/{role}/{worker.pk}"))
    return targets


def run_size(num_targets: int, num_cycles: int, port: int) -> dict:
    from controlplane.models import Deployment
    from controlplane.autoscaling.autoscaler import autoscale_all
    from controlplane.observability.store import scrape_cycle

    targets = make_fleet(num_targets, port, tag=f"b{num_targets}")
    ids = set(Deployment.objects.filter(name__startswith=f"b{num_targets}-").values_list("id", flat=True))
    from controlplane.models import Pool

    Deployment.objects.exclude(id__in=ids).update(autoscale_enabled=False)  # only this size's pools evaluate
    num_pools = Pool.objects.filter(deployment_id__in=ids).count()
    cycles = []
    for index in range(num_cycles + 1):
        started = time.perf_counter()
        result = scrape_cycle(targets=targets)
        scraped = time.perf_counter()
        decisions = autoscale_all()
        done = time.perf_counter()
        if index == 0:
            continue  # warm-up: first scrape of every target has no rates yet
        cycles.append({"total_s": done - started, "scrape_and_parse_s": result.scrape_seconds,
                       "store_s": result.store_seconds, "autoscale_s": done - scraped, "up": result.num_up,
                       "samples": result.num_samples,
                       "scaled": sum(1 for _, d in decisions if d is not None and d.changes)})
        time.sleep(0.2)
    totals = [c["total_s"] for c in cycles]
    return {"targets": num_targets, "pools_evaluated": num_pools, "cycles": len(cycles),
            "median_total_s": round(statistics.median(totals), 3), "max_total_s": round(max(totals), 3),
            "goal_s": GOAL_S, "meets_goal": statistics.median(totals) <= GOAL_S,
            "median_phases_s": {key: round(statistics.median(c[key] for c in cycles), 3)
                                for key in ("scrape_and_parse_s", "store_s", "autoscale_s")},
            "targets_up": cycles[-1]["up"], "samples_per_cycle": cycles[-1]["samples"],
            "scale_actions_in_timed_cycles": sum(c["scaled"] for c in cycles)}


class _Before:
    """The store phase's three paths as they were (for --compare): swapped into the store module's names."""

    @staticmethod
    def insert_samples(rows):
        from django.db import connection

        from controlplane.observability.models import Sample

        table = connection.ops.quote_name(Sample._meta.db_table)
        with connection.cursor() as cursor:
            cursor.executemany(f"INSERT INTO {table} (ts, deployment_id, role, worker_id, metric, value) "
                               f"VALUES (%s, %s, %s, %s, %s, %s)", rows)

    @staticmethod
    def upsert_states(states):
        import json

        from controlplane.observability.models import ScrapeState

        ScrapeState.objects.bulk_create(
            [ScrapeState(worker_id=w, deployment_id=d, role=r, snapshots=json.loads(snap), last_scrape_at=ts,
                         last_up=up, last_error=err) for w, d, r, snap, ts, up, err in states],
            batch_size=500, update_conflicts=True, unique_fields=["worker_id"],
            update_fields=["deployment_id", "role", "snapshots", "last_scrape_at", "last_up", "last_error"])

    @staticmethod
    def aligned_bucket_increases(les, snapshots):
        from controlplane.observability.quantiles import bucket_increases

        return bucket_increases([list(zip(les, counts)) for counts in snapshots])


def run_compare(num_targets: int, num_cycles: int, port: int) -> dict:
    from controlplane.observability import derive, store

    targets = make_fleet(num_targets, port, tag=f"c{num_targets}")
    now_paths = (store._insert_samples, store._upsert_states, derive.aligned_bucket_increases)
    before_paths = (_Before.insert_samples, _Before.upsert_states, _Before.aligned_bucket_increases)
    store.scrape_cycle(targets=targets)  # warm-up: every target's first snapshot
    store.scrape_cycle(targets=targets)
    times = {"before": [], "now": []}
    try:
        for _ in range(num_cycles):
            for label, paths in (("before", before_paths), ("now", now_paths)):
                store._insert_samples, store._upsert_states, derive.aligned_bucket_increases = paths
                result = store.scrape_cycle(targets=targets)
                times[label].append(result.store_seconds)
                time.sleep(0.2)
    finally:
        store._insert_samples, store._upsert_states, derive.aligned_bucket_increases = now_paths
    before, now = (statistics.median(times[k]) for k in ("before", "now"))
    return {"targets": num_targets, "cycles_each": num_cycles, "samples_per_cycle": result.num_samples,
            "median_store_s": {"before": round(before, 3), "now": round(now, 3)},
            "now_over_before": round(now / before, 3)}


def run_dashboard_query() -> dict:
    """24 h of 1-minute rollups for one deployment of 10 workers, all 25 metrics (what 24 h of scraping leaves),
    then the query API's read of one metric per worker over those 24 h."""
    from controlplane.models import Deployment
    from controlplane.observability.catalog import METRIC_IDS
    from controlplane.observability.models import Rollup
    from controlplane.observability.series import SeriesQuery, query_series

    deployment = Deployment.objects.create(name="dash", mode="disaggregated")
    now = time.time()
    start = (now - 86400) // 60 * 60
    rng = random.Random(0)
    rows = []
    for minute in range(1440):
        for worker in list(range(1, 11)) + [None]:
            for metric in METRIC_IDS.values():
                v = rng.random()
                rows.append(Rollup(ts=start + 60 * minute, deployment_id=deployment.pk, role="decode",
                                   worker_id=worker, metric=metric, avg=v, min=v, max=v, count=12))
    t = time.perf_counter()
    Rollup.objects.bulk_create(rows, batch_size=5000)
    fill_s = time.perf_counter() - t
    query = SeriesQuery(metric="itl_p99_seconds", deployment_id=deployment.pk, role="decode", worker="all",
                        start=now - 86400, end=now, step=300)
    timings = []
    for _ in range(5):
        t = time.perf_counter()
        source, series = query_series(query, now=now)
        timings.append(time.perf_counter() - t)
    return {"rollup_rows": len(rows), "fill_s": round(fill_s, 2), "source": source, "series": len(series),
            "points_per_series": len(series[0]["points"]),
            "median_query_ms": round(statistics.median(timings) * 1000, 1),
            "goal_ms": 300}


def main(argv=None) -> None:
    args = parse_args(argv)
    from tests.procs import free_port

    with tempfile.TemporaryDirectory(prefix="tandem-bench-") as var_dir:
        setup_django(var_dir, args.database_url)
        from django.db import connection

        port = free_port()
        server = start_server(port)
        try:
            if args.compare:
                emit({"benchmark": "scrape_cycle_store_compare", "database": connection.vendor,
                      "sizes": [run_compare(n, args.cycles, port) for n in args.targets],
                      "environment": environment()})
                return
            sizes = [run_size(n, args.cycles, port) for n in args.targets]
        finally:
            server.terminate()
            server.wait(10)
        query = None if args.skip_query else run_dashboard_query()
        emit({"benchmark": "scrape_cycle", "database": connection.vendor, "sizes": sizes,
              "dashboard_24h_query": query, "environment": environment()})


if __name__ == "__main__":
    main()
