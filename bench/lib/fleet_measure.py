"""Measurements of bench/fleet/sim_fleet.py: which processes make up the control plane and their CPU and RSS, RSS
over a run, the passes of each periodic kind (the control plane's /metrics), the deployment page with a day of data
(in the SQL store or in Prometheus) over real HTTP, and the goals each backend's figures are held to."""
from __future__ import annotations

import math
import os
import re
import statistics
import time

PAGE_GOAL_MS = 300.0
SCALE_GOAL_S = 10.0
CPU_GOAL_CORES = {"embedded": 0.5, "prometheus": 0.3}  # the control plane's; with Prometheus it only reads
# The control plane's own processes, and the fleet's side (components()).
CONTROL_PLANE = ("web", "celery_control", "celery_periodic", "beat")
FLEET = ("fleet_agent", "sim_hosts", "gateways", "bench")
KINDS = ("reconcile", "health", "scrape", "alert_evaluation", "autoscale")
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # telemetry.DURATION_BUCKETS
MIN_SHARE_OF_PASSES = 0.8


def control_processes(stack) -> dict[str, list]:
    """name -> psutil processes: the stack's children, the simulated hosts (children of the fleet agent), and the
    gateways (started by the fleet agent in their own sessions; found by their command line)."""
    import psutil

    procs: dict[str, list] = {}
    for name, child in stack.children.items():
        if child.handle is None:
            continue
        try:
            proc = psutil.Process(child.handle.pid)
        except psutil.NoSuchProcess:
            continue
        procs[name] = [proc]
        if name == "web":  # gunicorn's worker processes (runserver has none)
            procs[name] += proc.children()
        if name == "agent":
            procs["sim_hosts"] = [c for c in proc.children() if "inference.worker.sim_host" in " ".join(c.cmdline())]
    gateways = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "inference.gateway" in cmd and (proc.info["environ"] or {}).get("TANDEM_VAR_DIR") == stack.env[
                "TANDEM_VAR_DIR"]:
            gateways.append(proc)
    procs["gateways"] = gateways
    return procs


def components(stack, *, prometheus=None, database=None) -> dict[str, list[int]]:
    """component -> pids, for bench/lib/fleet_cpu.CpuWindow: the control plane's processes (CONTROL_PLANE),
    Prometheus, the fleet's (FLEET: the fleet agent, its simulated hosts, the gateways, and this bench, which asks
    the API), and with `database` (fleet_stack.DatabaseBackends) the PostgreSQL backends serving the bench's
    database, which no pinning reaches."""
    procs = control_processes(stack)

    def pids(*names: str) -> list[int]:
        return [p.pid for name, group in procs.items() if name.startswith(names) for p in group]
    out = {"web": pids("web"), "celery_control": pids("control"), "celery_periodic": pids("periodic"),
           "beat": pids("beat"), "fleet_agent": pids("agent"), "sim_hosts": pids("sim_hosts"),
           "gateways": pids("gateways"), "bench": [os.getpid()]}
    if prometheus is not None:
        out["prometheus"] = [prometheus.proc.pid]
    if database is not None:
        out["postgresql"] = database.pids()
    return out


def cpu_summary(report: dict) -> dict:
    """The sides of a CpuWindow report: the control plane (CONTROL_PLANE, what the goals hold), it with Prometheus
    (the CPU set it shares), and the fleet; each in cores and CPU seconds per cycle."""
    def total(names) -> dict:
        parts = [report[name] for name in names if name in report]
        return {"cores": round(sum(p["cores"] for p in parts), 3),
                "cpu_s_per_cycle": round(sum(p["cpu_s_per_cycle"] for p in parts), 4)}
    return {"control_plane": total(CONTROL_PLANE), "control_plane_and_prometheus": total((*CONTROL_PLANE,
                                                                                         "prometheus")),
            "fleet": total(FLEET)}


def rss_mib(procs: dict[str, list]) -> dict[str, float]:
    import psutil

    out = {}
    for name, group in procs.items():
        total = 0
        for proc in group:
            try:
                total += proc.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        out[name] = round(total / 2**20, 1)
    return out


def sample_rss(stack, seconds: float, every: float = 10.0) -> dict:
    procs = control_processes(stack)
    samples: list[tuple[float, dict]] = []
    started = time.monotonic()
    while True:
        samples.append((time.monotonic() - started, rss_mib(procs)))
        if time.monotonic() - started >= seconds:
            break
        stack.poll()
        time.sleep(every)
    out = {}
    for name in samples[0][1]:
        values = [s[name] for _, s in samples]
        # Growth from the first to the last quarter of the run (medians), per hour: flat is ~0.
        quarter = max(1, len(values) // 4)
        first, last = statistics.median(values[:quarter]), statistics.median(values[-quarter:])
        span_h = max(1e-9, (samples[-1][0] - samples[0][0]) / 3600)
        out[name] = {"start_mib": values[0], "end_mib": values[-1], "max_mib": max(values),
                     "growth_mib_per_hour": round((last - first) / span_h, 1)}
    return {"duration_s": round(samples[-1][0], 1), "num_samples": len(samples), "processes": out}


def cycle_stats(api) -> dict[str, dict]:
    """{kind: {"count", "sum", "buckets": {le: n}}} from the web process's /metrics."""
    r = api.session.get(f"{api.base}/metrics", timeout=60)
    r.raise_for_status()
    text = r.text
    stats: dict[str, dict] = {}
    for line in text.splitlines():
        m = re.match(r'tandem_controlplane_cycle_duration_seconds_(bucket|sum|count)\{(.*)\} (\S+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        stat = stats.setdefault(labels["kind"], {"count": 0.0, "sum": 0.0, "buckets": {}})
        if m.group(1) == "bucket":
            stat["buckets"][labels["le"]] = float(m.group(3))
        else:
            stat[m.group(1)] = float(m.group(3))
    return stats


def window_summary(before: dict, after: dict, seconds: float, interval: float, scrape_shards: int = 1,
                   kinds: tuple[str, ...] = KINDS) -> dict:
    out = {}
    for kind in kinds:
        # A scrape split in shards runs one pass per shard each interval (each a pass of its share of the fleet).
        expected = seconds / interval * (scrape_shards if kind == "scrape" else 1)
        a, b = after.get(kind), before.get(kind, {"count": 0.0, "sum": 0.0, "buckets": {}})
        if a is None:
            out[kind] = {"passes": 0, "expected_passes": round(expected, 1), "keeps_cycle": False}
            continue
        passes = a["count"] - b["count"]
        mean = (a["sum"] - b["sum"]) / passes if passes else None
        # The slowest pass lies in the first bucket whose count reaches all passes of the window.
        slowest_le = None
        for le in [*map(str, BUCKETS), "+Inf"]:
            if a["buckets"].get(le, 0) - b["buckets"].get(le, 0) >= passes:
                slowest_le = le
                break
        slowest = float("inf") if slowest_le == "+Inf" else float(slowest_le) if slowest_le else None
        keeps = bool(passes) and passes >= MIN_SHARE_OF_PASSES * expected and slowest is not None \
            and slowest <= interval
        out[kind] = {"passes": int(passes), "expected_passes": round(expected, 1),
                     "mean_s": round(mean, 4) if mean is not None else None,
                     "slowest_at_most_s": slowest_le, "share_of_interval": round(mean / interval, 3) if mean else None,
                     "keeps_cycle": keeps}
    return out


def roll_up_seeded(deployment, now: float) -> int:
    """Roll up the seeded raw minutes (the last TANDEM_METRICS_RAW_RETENTION_S before `now`) that no pass rolled
    up: the running stack's rollup pass carries on after its latest rollup (minutes after this run began), and
    once it has written one, seed()'s own rollup_pending stops there too. Each minute of the deployment without a
    rollup gets one from its raw samples (rollup.rollup_pending's aggregate)."""
    from django.conf import settings
    from django.db.models import Avg, Count, F, Max, Min
    from django.db.models.functions import Floor

    from controlplane.observability.models import Rollup, Sample

    start = math.floor((now - settings.TANDEM_METRICS_RAW_RETENTION_S) / 60) * 60  # seed()'s older rollups end here
    end = math.floor((now - 120) / 60) * 60  # complete minutes
    done = set(Rollup.objects.filter(deployment_id=deployment.pk, ts__gte=start).values_list("ts", flat=True)
               .distinct())
    groups = (Sample.objects.filter(deployment_id=deployment.pk, ts__gte=start, ts__lt=end)
              .annotate(minute=Floor(F("ts") / 60) * 60)
              .values("minute", "deployment_id", "role", "worker_id", "metric")
              .annotate(avg=Avg("value"), min=Min("value"), max=Max("value"), count=Count("id")).order_by())
    rows = Rollup.objects.bulk_create([Rollup(ts=float(g["minute"]), deployment_id=g["deployment_id"], role=g["role"],
                                              worker_id=g["worker_id"], metric=g["metric"], avg=g["avg"],
                                              min=g["min"], max=g["max"], count=g["count"])
                                       for g in groups if float(g["minute"]) not in done], batch_size=5000)
    return len(rows)


def measure_page(env: dict, web_url: str, name: str, repeat: int = 5, prometheus=None, folder=None) -> dict:
    """A day of series for one deployment, then its page and 24 h charts over real HTTP as a logged-in viewer.
    The day is in the backend the control plane reads: the SQL store (bench/lib/seeded_day),
    or with `prometheus` (bench/lib/prometheus_process) that Prometheus, backfilled with promtool. The deployment is
    dated a day back, since a chart never starts before its deployment was created; the chart cache (Redis,
    TANDEM_CACHE_URL) is emptied before each timed request, so that each reads the backend."""
    import requests

    # The web server's settings, SECRET_KEY included: the session written here must be valid there.
    for key in ("DATABASE_URL", "TANDEM_VAR_DIR", "CELERY_BROKER_URL", "DJANGO_DEBUG", "SECRET_KEY", "ALLOWED_HOSTS",
                "SECURE_SSL_REDIRECT", "TANDEM_CACHE_URL"):
        if key in env:
            os.environ[key] = env[key]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.core.cache import cache
    from django.db import connections
    from django.test import Client

    from bench.lib.seeded_day import DAY_S, seed, settle_tables
    from controlplane.auth import Role, set_role
    from controlplane.models import Deployment, Worker
    from dashboards.panels import deployment_has_gpu

    try:
        deployment = Deployment.objects.get(name=name)
        created = deployment.created_at - timedelta(seconds=DAY_S + 600)
        Deployment.objects.filter(pk=deployment.pk).update(created_at=created)
        workers = list(Worker.objects.filter(deployment=deployment, status="ready").exclude(role="gateway"))
        if prometheus is None:
            now = time.time()
            seeded = seed(deployment, workers, now)
            seeded["num_rollups_before_the_stacks"] = roll_up_seeded(deployment, now)
            seeded.update(settle_tables())
        else:
            from bench.lib.prometheus_process import backfill_day

            seeded = backfill_day(prometheus, deployment=name, workers=[(w.pk, w.role) for w in workers],
                                  has_gpu=deployment_has_gpu(deployment), end=time.time() - 5, step_s=5.0,
                                  folder=folder)
        viewer, _ = get_user_model().objects.get_or_create(username="bench-viewer")
        set_role(viewer, Role.VIEWER)
        client = Client()
        client.force_login(viewer)
        cookies = {"sessionid": client.cookies["sessionid"].value}
        out = {"backend": "embedded" if prometheus is None else "prometheus", "data": seeded}
        for label, path in (("deployment_page", f"/deployments/{name}/"),
                            ("charts_24h", f"/deployments/{name}/charts.json?range=24h")):
            times = []
            for attempt in range(1 + repeat):  # the first is a warm-up
                cache.clear()
                started = time.perf_counter()
                r = requests.get(web_url + path, cookies=cookies, timeout=60, allow_redirects=False)
                if attempt:
                    times.append((time.perf_counter() - started) * 1000)
                if r.status_code != 200:  # a redirect to the login page would time the wrong page
                    raise RuntimeError(f"GET {path} answered {r.status_code}, not the page")
                if path.endswith("24h") and r.json().get("error"):  # an error drawn fast is not the page
                    raise RuntimeError(f"GET {path}: {r.json()['error']}")
            out[label] = {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}
        out["goal_ms"] = PAGE_GOAL_MS
        out["meets_goal"] = max(out["deployment_page"]["median_ms"], out["charts_24h"]["median_ms"]) <= PAGE_GOAL_MS
        return out
    finally:
        connections.close_all()  # the next backend's run drops and creates this database afresh


def rules_keep_cycle(figures: dict, interval: float) -> bool:
    """Prometheus evaluated the recording rules every interval (none missed, none failed, the last in time)."""
    return (figures["rule_iterations_missed"] == 0 and figures["rule_evaluation_failures"] == 0
            and figures["rule_group_last_duration_s"] is not None and figures["rule_group_last_duration_s"] <= interval)


def time_http_sd(api, repeat: int = 5) -> dict:
    """GET /api/v1/prometheus/targets as Prometheus asks it (every refresh_interval): median and max ms."""
    times, num = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        num = len(api.ok("GET", "prometheus/targets"))
        times.append((time.perf_counter() - started) * 1000)
    return {"targets": num, "median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}


def goals(doc: dict) -> dict:
    """The issue's goals for one backend, each {"value", "goal", "met"}: at the largest size, every periodic pass
    keeps the cycle (with Prometheus: its rule evaluation too) and the control plane's processes use at most
    the backend's CPU_GOAL_CORES; a pool scale is in the gateway's membership within SCALE_GOAL_S; the deployment
    page and its 24 h charts (each its median, the chart cache emptied) answer within PAGE_GOAL_MS."""
    largest = doc["sizes"][-1] if doc.get("sizes") else {}
    cpu_goal = CPU_GOAL_CORES[doc["backend"]]
    late = [kind for kind, cycle in largest.get("cycles", {}).items() if not cycle["keeps_cycle"]]
    out = {"every_pass_keeps_cycle": {"value": late, "goal": "no kind late", "met": bool(largest.get("keeps_cycle"))},
           "control_plane_cpu_cores": {"value": largest.get("control_plane_cpu_cores"), "goal": cpu_goal,
                                       "met": (largest.get("control_plane_cpu_cores") or 1e9) <= cpu_goal}}
    if "prometheus" in largest:
        out["prometheus_rules_keep_cycle"] = {"value": largest["prometheus"]["rule_group_last_duration_s"],
                                              "goal": doc["interval_s"], "met": largest["prometheus"]["keeps_cycle"]}
    scale = doc.get("pool_scale", {})
    out["pool_scale_in_membership_s"] = {"value": scale.get("in_membership_s"), "goal": SCALE_GOAL_S,
                                         "met": bool(scale.get("meets_goal"))}
    page = doc.get("deployment_page", {})
    for key in ("deployment_page", "charts_24h"):  # the page's HTML, and the 24 h charts it fetches
        value = page[key]["median_ms"] if key in page else None
        out[f"{key}_ms"] = {"value": value, "goal": PAGE_GOAL_MS, "met": value is not None and value <= PAGE_GOAL_MS}
    return out
