"""Server time of the deployment page and its chart data with 24 h of 5-second data for 10 workers (goal ≤ 300 ms).

The data is what a day of scraping leaves under the default retention: the last 6 h as raw 5-second samples
(written into the observability app's Sample table and rolled up by its own `rollup_pending`), the 18 h before as
1-minute rollups (written directly: their raw samples would have been pruned by now), for 5 prefill + 5 decode
workers, the gateway and the three pool aggregates, every metric of the catalog. Then the Django test client —
in-process, so the figure is server time without network — fetches, as a viewer:
- the deployment page (HTML: pools, workers, alerts, recent actions; the charts arrive by fetch), and
- its chart data (`charts.json`, 10 figures from 16 series reads) for each range: 15 min, 1 h, 6 h, 24 h, and
- its stage columns (`stages.json`, fetched beside charts.json: 12 figures from 13 series reads and the columns'
  current values) for the same ranges.
Every timed request starts with an empty cache (the chart data of long ranges is otherwise kept a few seconds:
dashboards/chart_cache.py); `reused_median_ms` is the same requests repeated within that time.

    python bench/controlplane/dashboard_page.py          # SQLite in a temporary folder
    python bench/controlplane/dashboard_page.py --database-url postgres://127.0.0.1:5432/test --repeat 7

With a big fleet's database around it and a loaded machine (bench/lib/fleet_data.py): bench/fleet/sim_fleet.py's
1,000 workers are the seeded deployment's 20 and 49 more deployments of 20, whose last minutes of raw samples are
written too; --cpu-load runs busy processes while the URLs are timed. A PostgreSQL database stays seeded after the
run, and a later run with --reuse times it again without seeding: the clock the pages read (time.time, in this
process) is then set back by the data's age (`data_age_s`), so that every range sees the data as it did just after
seeding.

    python bench/controlplane/dashboard_page.py --database-url postgres://127.0.0.1:5432/tandem_page --workers 20 \
        --fleet-deployments 49 --fleet-workers 20 --fleet-raw-minutes 10 --cpu-load 6
    python bench/controlplane/dashboard_page.py --database-url postgres://127.0.0.1:5432/tandem_page --reuse \
        --cpu-load 6
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import emit, environment, setup_django  # noqa: E402
from bench.lib.fleet_data import CpuLoad, create_other_deployments, seed_other_samples  # noqa: E402
from bench.lib.seeded_day import DAY_S, seed, settle_tables, value_at  # noqa: E402

GOAL_MS = 300.0
RANGES = ("15m", "1h", "6h", "24h")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", default=None, help="default: SQLite in a temporary folder")
    p.add_argument("--repeat", type=int, default=5, help="timed requests per URL (after one warm-up)")
    p.add_argument("--workers", type=int, default=10, help="half prefill, half decode")
    p.add_argument("--gpu", action=argparse.BooleanOptionalAction, default=True,
                   help="give the node a GPU (GPU panels) or not (CPU panels)")
    p.add_argument("--fleet-deployments", type=int, default=0, help="other deployments around the seeded one")
    p.add_argument("--fleet-workers", type=int, default=20, help="workers of each other deployment")
    p.add_argument("--fleet-raw-minutes", type=float, default=10.0,
                   help="minutes of raw samples of the other deployments, ending now")
    p.add_argument("--cpu-load", type=int, default=0, help="busy processes while the URLs are timed")
    p.add_argument("--reuse", action="store_true",
                   help="time a database seeded by an earlier run (no seeding; needs --database-url)")
    return p.parse_args(argv)


def create_fleet(var_dir: Path, num_workers: int, gpu: bool):
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from controlplane.auth import Role, set_role
    from controlplane.models import Node, Pool, Worker
    from controlplane.services import deployment_create

    admin = get_user_model().objects.create_user("bench-admin")
    set_role(admin, Role.ADMIN)
    viewer = get_user_model().objects.create_user("bench-viewer")
    set_role(viewer, Role.VIEWER)
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * 2**30}
            for i in range(8)] if gpu else []
    node = Node.objects.create(name="bench", hostname="bench", gpus=gpus, last_seen_at=timezone.now())
    model = var_dir / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    half = num_workers // 2
    deployment = deployment_create(name="bench", mode="disaggregated", model_path=str(model), actor=admin,
                                   replicas={"prefill": half, "decode": num_workers - half},
                                   max_replicas={"prefill": 16, "decode": 16}).deployment
    now = timezone.now()
    # The seeded day of samples is the deployment's life: charts never start before a deployment was created.
    deployment.created_at = now - timedelta(seconds=DAY_S + 600)
    deployment.__class__.objects.filter(pk=deployment.pk).update(created_at=deployment.created_at)
    workers = []
    for index in range(num_workers):
        role = "prefill" if index < half else "decode"
        pool = Pool.objects.get(deployment=deployment, role=role)
        workers.append(Worker.objects.create(
            deployment=deployment, pool=pool, role=role, revision=deployment.current_revision, node=node,
            gpu_index=index % 8 if gpu else None, status="ready", port=42000 + index, pid=50000 + index,
            started_at=now, ready_at=now))
    workers.append(Worker.objects.create(deployment=deployment, role="gateway", node=node, status="ready",
                                         port=42999, pid=50999, started_at=now, ready_at=now))
    return deployment, workers, viewer


def measure(client, url: str, repeat: int, *, cold: bool = True) -> dict:
    """Median and max server time of `repeat` GETs after a warm-up. `cold`: the cache is cleared before each, so
    that chart data kept for a few seconds (dashboards.chart_cache) is computed every time."""
    from django.core.cache import cache
    from django.db import connection, reset_queries
    from django.test.utils import CaptureQueriesContext

    response = client.get(url)  # warm-up (template compilation, connection)
    if response.status_code != 200:
        raise SystemExit(f"GET {url} answered {response.status_code}")
    times, cpu = [], []
    for _ in range(repeat):
        if cold:
            cache.clear()
        started, started_cpu = time.perf_counter(), time.process_time()
        response = client.get(url)
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
        assert response.status_code == 200
    # Django clears the query log when a request starts: count after an empty log so the slice is right.
    reset_queries()
    if cold:
        cache.clear()
    with CaptureQueriesContext(connection) as queries:
        client.get(url)
    # The web process's own CPU (not the database's): on a loaded machine the wall time is mostly waiting for a
    # core, and this is what the request costs the machine.
    doc = {"url": url, "median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1),
           "median_cpu_ms": round(statistics.median(cpu), 1),
           "num_queries": len(queries), "bytes": len(response.content)}
    if ".json" in url:
        figures = response.json()["figures"]
        doc["num_figures"] = len(figures)
        doc["max_points_per_trace"] = max((len(t["x"]) for f in figures.values() for t in f["data"]), default=0)
        doc["num_points"] = sum(len(t["x"]) for f in figures.values() for t in f["data"])
    return doc


def prepare(args, var_dir: str) -> tuple:
    """(deployment, viewer, data): seed a fresh database, or find what an earlier run seeded (--reuse)."""
    from django.contrib.auth import get_user_model

    from controlplane.models import Deployment, Worker
    from controlplane.observability.models import Sample

    existing = Deployment.objects.filter(name="bench").first()
    if args.reuse:
        if existing is None:
            raise SystemExit("--reuse: no seeded deployment `bench` in this database")
        newest = Sample.objects.filter(deployment_id=existing.pk).order_by("-ts").values_list("ts", flat=True).first()
        age = time.time() - newest if newest else 0.0
        real_time = time.time
        time.time = lambda: real_time() - age  # the pages read Unix time through time.time
        return existing, get_user_model().objects.get(username="bench-viewer"), {
            "reused": True, "data_age_s": round(age, 1),
            "num_samples": Sample.objects.count(),
            "num_workers_in_fleet": Worker.objects.exclude(role="gateway").count()}
    if existing is not None:
        raise SystemExit("deployment `bench` exists already: pass --reuse, or a fresh database")
    deployment, workers, viewer = create_fleet(Path(var_dir), args.workers, args.gpu)
    now = time.time()
    fleet = []
    if args.fleet_deployments:
        admin = get_user_model().objects.get(username="bench-admin")
        fleet = create_other_deployments(num_deployments=args.fleet_deployments,
                                         workers_per_deployment=args.fleet_workers, admin=admin,
                                         model_path=str(Path(var_dir) / "model"), gpu=args.gpu)
    data = seed(deployment, workers, now)
    if fleet:
        data.update(seed_other_samples(fleet, now=now, minutes=args.fleet_raw_minutes, value_at=value_at))
    data.update(settle_tables())
    data["num_workers_in_fleet"] = Worker.objects.exclude(role="gateway").count()
    return deployment, viewer, data


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.reuse and not args.database_url:
        raise SystemExit("--reuse needs --database-url")
    with tempfile.TemporaryDirectory(prefix="tandem-bench-dash-") as var_dir:
        setup_django(var_dir, args.database_url)
        from django.db import connection
        from django.test import Client

        deployment, viewer, seeded = prepare(args, var_dir)
        client = Client()
        client.force_login(viewer)
        with CpuLoad(args.cpu_load):
            page = measure(client, f"/deployments/{deployment.name}/", args.repeat)
            charts = {key: measure(client, f"/deployments/{deployment.name}/charts.json?range={key}", args.repeat)
                      for key in RANGES}
            stages = {key: measure(client, f"/deployments/{deployment.name}/stages.json?range={key}", args.repeat)
                      for key in RANGES}
            # The page's 5-second refresh of a long range within the few seconds its chart data is kept.
            reused = {f"{kind}_{key}": measure(client, f"/deployments/{deployment.name}/{kind}.json?range={key}",
                                               args.repeat, cold=False)["median_ms"]
                      for kind in ("charts", "stages") for key in ("6h", "24h")}
            live = measure(client, f"/deployments/{deployment.name}/live", args.repeat)
            overview = measure(client, "/", args.repeat)
            load_avg = environment()["load_avg"]
        worst = max([page["median_ms"]] + [c["median_ms"] for c in (*charts.values(), *stages.values())])
        emit({
            "bench": "dashboard_page",
            "goal_ms": GOAL_MS,
            "database": connection.vendor,
            "num_workers": args.workers,
            "gpu": args.gpu,
            "cpu_load_processes": args.cpu_load,
            "load_avg_while_timed": load_avg,
            "data": seeded,
            "deployment_page": page,
            "live_fragment": live,
            "overview_page": overview,
            "charts": charts,
            "stages": stages,
            "reused_median_ms": reused,
            "worst_median_ms": worst,
            "meets_goal": worst <= GOAL_MS,
            "environment": environment(),
        })


if __name__ == "__main__":
    main()
