"""One control plane driving a simulated fleet on PostgreSQL + Redis: does every periodic pass keep a 5 s cycle?

The control plane's own processes run as `make run` starts them (web, a Celery worker on `control`, beat; with
--periodic-workers, Celery workers of their own for `periodic`, beat's passes, as docs/operating.md advises for a large
fleet; DJANGO_DEBUG=0 as in production), with the node agent replaced by a simulated fleet (`manage.py tandem_simfleet`: N nodes, each on its own `node.<name>` queue,
workers hosted by simulated worker hosts). Deployments are created through the REST API with the engine setting
`simulate`, each with its real gateway, its default alert rules plus one per worker, and autoscaling on (with no
traffic it evaluates every pool; a tolerance of 100% keeps it from shrinking the idle pools). Then, for each fleet size (deployments scaled up through the
API, same stack):

- time until every worker is ready;
- a measurement window: per kind of periodic work (reconcile, health, scrape, alert_evaluation, autoscale) the
  number of passes and their mean and slowest duration (the durations each pass records, read from the web
  process's /metrics), and the CPU seconds each component spent, from /proc (bench/lib/fleet_cpu.py): web, the
  Celery workers, beat and Prometheus (the control plane's side), the fleet agent, its simulated hosts, the
  gateways and this bench (the fleet's side), and the PostgreSQL backends of the bench's database; per cycle and
  as cores;
- "keeps the cycle": every kind ran about once per interval (at least 80 % of the expected passes) and its slowest
  pass fit in the interval.

At the largest size: one pool scale (decode +2 of one deployment) timed until its workers are ready and in the
gateway's membership; RSS of each control-plane process sampled over --duration seconds (flat or not); the deployment
page and its 24 h charts over real HTTP after a day of series is written for one deployment
(bench/lib/seeded_day), each request with the chart cache emptied.

--backend prometheus runs the same with a real Prometheus (/usr/bin/prometheus, bench/lib/prometheus_process.py)
scraping the fleet every interval through Tandem's http_sd (GET /api/v1/prometheus/targets, a viewer token) and
evaluating Tandem's recording rules, and the control plane with TANDEM_METRICS_BACKEND=prometheus (it scrapes
nothing: no scrape pass is expected; Prometheus' rule evaluation, scrapes, CPU and the http_sd answer are reported
instead). The page's day of data is then in Prometheus, backfilled with `promtool tsdb create-blocks-from
openmetrics`. --backend both runs the embedded backend, then Prometheus, each on a fresh database. One JSON document
is printed: each backend's figures and, per backend, the goals ({"value", "goal", "met"}).

With two CPUs or more (--pin, the default there) the control plane's side runs on one half of the CPUs and the
fleet's side on the other, so that the fleet's cost does not land on the control plane's figures; the JSON says
which CPUs each side had, and each component which CPUs its processes were allowed. PostgreSQL and Redis are the
machine's own services and are not pinned.

The stack is bench/lib/fleet_stack.py's, the calls to the REST API bench/lib/fleet_api.py's, the measurements
bench/lib/fleet_measure.py's; this script runs the sizes and reports.

    python bench/fleet/sim_fleet.py                             # 250, 500, 1000 workers; 50 deployments; 100 nodes
    python bench/fleet/sim_fleet.py --sizes 100 --deployments 10 --nodes 10 --window 30 --duration 60  # a quick look
    python bench/fleet/sim_fleet.py --backend both              # embedded, then Prometheus, at each size
    python bench/fleet/sim_fleet.py --shared-gateways 2         # the 50 deployments behind two shared gateways
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import ROOT, emit  # noqa: E402
from bench.lib.fleet_api import Api, answers, deploy, scale_all, share, split, wait, worker_counts  # noqa: E402
from bench.lib.fleet_cpu import CpuWindow, affinity, cpu_list, cpu_sets  # noqa: E402
from bench.lib.fleet_measure import (CONTROL_PLANE, FLEET, KINDS, SCALE_GOAL_S, components,  # noqa: E402
                                     control_processes, cpu_summary, cycle_stats, goals, measure_page, rss_mib,
                                     rules_keep_cycle, sample_rss, time_http_sd, window_summary)
from bench.lib.fleet_stack import (DatabaseBackends, free_port, fresh_services, manage, stack_env,  # noqa: E402
                                   stack_specs, stop_stack)
from bench.lib.prometheus_process import PrometheusProcess, own_figures  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="250,500,1000", help="fleet sizes (workers, gateways not counted), ascending")
    p.add_argument("--deployments", type=int, default=50)
    p.add_argument("--nodes", type=int, default=100)
    p.add_argument("--hosts", type=int, default=4, help="simulated worker host processes")
    p.add_argument("--interval", type=int, default=5, help="the cycle: reconcile, health, scrape, alerts, autoscale")
    p.add_argument("--window", type=float, default=60.0, help="seconds measured at each size")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of RSS sampling at the largest size")
    p.add_argument("--profile", default="tiny-cpu")
    p.add_argument("--database-url", default="postgres://127.0.0.1:5432/tandem_sim",
                   help="dropped and created afresh (connects to database `test` on the same server to do so)")
    p.add_argument("--broker-url", default="redis://127.0.0.1:6379/11", help="flushed at start")
    p.add_argument("--cache-url", default="redis://127.0.0.1:6379/12",
                   help="TANDEM_CACHE_URL (the chart cache; emptied before each timed page request)")
    p.add_argument("--backend", choices=("embedded", "prometheus", "both"), default="embedded",
                   help="the metrics backend: embedded (Tandem scrapes and stores), prometheus (a real Prometheus "
                        "scrapes the fleet through http_sd and records Tandem's rules; /usr/bin/prometheus), or both, "
                        "one after the other, each on a fresh database")
    p.add_argument("--control-concurrency", type=int, default=4, help="threads of each Celery worker")
    p.add_argument("--periodic-workers", type=int, default=2,
                   help="Celery worker processes on the `periodic` queue (beat's passes), beside the one on `control` "
                        "(the reconciles each change asks for); 0: one worker consumes both, as `make run` starts it")
    p.add_argument("--debug", action="store_true", help="run the control plane with DJANGO_DEBUG=1 (it keeps the "
                   "last 9,000 queries of every database connection in memory)")
    # runserver by default: a run with gunicorn once lost a gunicorn worker well into the run, for a reason not found
    # yet ("Worker exiting", no error), and the bench stopped there.
    p.add_argument("--web", choices=("gunicorn", "runserver"), default="runserver",
                   help="the web tier: make run's runserver, or gunicorn (2 processes x 8 threads, as in production)")
    p.add_argument("--conn-max-age", type=int, default=60,
                   help="TANDEM_DB_CONN_MAX_AGE of every control-plane process (0: a connection per request/task)")
    p.add_argument("--shared-gateways", type=int, default=0,
                   help="serve the deployments through this many shared gateways (attached in turn) instead of a "
                        "gateway each")
    p.add_argument("--skip-page", action="store_true", help="skip seeding a day of data and the page timing")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                   help="the control plane (web, Celery workers, beat, Prometheus) on one half of the CPUs, the fleet "
                        "(its agent, simulated hosts and gateways) and this bench on the other (default: where there "
                        "are two CPUs or more)")
    return p.parse_args(argv)


def measure_window(stack, api: Api, seconds: float, interval: float, scrape_shards: int, prometheus=None,
                   database=None) -> dict:
    """Passes of each periodic kind over the window and the CPU each component spent (bench/lib/fleet_cpu.py, from
    /proc); with Prometheus scraping (the control plane then does not), Prometheus' own figures too."""
    procs = control_processes(stack)
    if prometheus is not None:
        import psutil

        procs["prometheus"] = [psutil.Process(prometheus.proc.pid)]
    window = CpuWindow(lambda: components(stack, prometheus=prometheus, database=database))
    window.sample()
    before, started = cycle_stats(api), time.monotonic()
    deadline = started + seconds
    while time.monotonic() < deadline:
        stack.poll()
        time.sleep(1.0)
        window.sample()
    elapsed = time.monotonic() - started
    after = cycle_stats(api)
    kinds = window_summary(before, after, elapsed, interval, scrape_shards,
                           kinds=tuple(k for k in KINDS if prometheus is None or k != "scrape"))
    cpu = window.report(interval)
    sides = cpu_summary(cpu)
    out = {"window_s": round(elapsed, 1), "cycles": kinds,
           "keeps_cycle": all(k["keeps_cycle"] for k in kinds.values()),
           "cpu_by_component": cpu, "cpu_by_side": sides,
           "control_plane_cpu_cores": sides["control_plane"]["cores"],
           "rss_mib_by_process": rss_mib(procs), "load_avg": os.getloadavg()}
    if prometheus is not None:
        out["prometheus"] = own_figures(prometheus)
        out["prometheus"]["keeps_cycle"] = rules_keep_cycle(out["prometheus"], interval)
        out["http_sd"] = time_http_sd(api)
    return out


def gateway_rows(api: Api) -> tuple[int, int]:
    """(shared gateways ready, per-deployment gateways still live)."""
    rows = [w for w in api.ok("GET", "workers/", params={"role": "gateway"}) if w["status"] not in ("stopped",
                                                                                                     "failed")]
    return (sum(1 for w in rows if w["shared_gateway"] and w["status"] == "ready"),
            sum(1 for w in rows if not w["shared_gateway"]))


def measure_scale(api: Api, name: str, stack) -> dict:
    """decode +2 of one deployment: seconds until the new workers are ready, and until its endpoints list them."""
    before = [w for w in api.ok("GET", "workers/", params={"deployment": name, "role": "decode"})
              if w["status"] == "ready"]
    target = len(before) + 2
    started = time.monotonic()
    api.ok("POST", f"deployments/{name}/scale", json={"role": "decode", "replicas": target})
    wait("the scaled pool to be ready", lambda: sum(
        w["status"] == "ready" for w in api.ok("GET", "workers/", params={"deployment": name, "role": "decode"}))
        >= target, timeout=120, interval=0.2, poll=stack.poll)
    ready_s = time.monotonic() - started
    wait("the endpoints to list them", lambda: len(
        api.ok("GET", f"deployments/{name}/endpoints")["groups"][0]["decode"]) >= target, timeout=60, interval=0.2)
    listed_s = time.monotonic() - started
    api.ok("POST", f"deployments/{name}/scale", json={"role": "decode", "replicas": len(before)})
    return {"deployment": name, "decode_from": len(before), "decode_to": target, "ready_s": round(ready_s, 2),
            "in_membership_s": round(listed_s, 2), "goal_s": SCALE_GOAL_S, "meets_goal": listed_s <= SCALE_GOAL_S}


def main(argv=None) -> None:
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if sizes != sorted(sizes) or any(s < 2 * args.deployments for s in sizes):
        raise SystemExit("--sizes must ascend and give each deployment at least 2 workers")
    backends = ("embedded", "prometheus") if args.backend == "both" else (args.backend,)
    cpus = cpu_sets() if args.pin is not False else None
    if args.pin and cpus is None:
        raise SystemExit(f"--pin needs two CPUs or more; this process may use {sorted(os.sched_getaffinity(0))}")
    if cpus is not None:
        os.sched_setaffinity(0, cpus[1])  # this bench asks the API as a client would: on the fleet's side
    # One key for every run: the bench's own Django (measure_page) keeps the settings of the first.
    secret = "sim-fleet-bench-" + os.urandom(16).hex()
    runs = {backend: run_backend(args, sizes, backend, secret, cpus) for backend in backends}
    emit({"bench": "sim_fleet", "database": "postgresql", "broker": "redis", "interval_s": args.interval,
          "control_workers": 1, "periodic_workers": args.periodic_workers, "web": args.web,
          "db_conn_max_age_s": args.conn_max_age, "threads_each": args.control_concurrency,
          "django_debug": args.debug, "deployments": args.deployments, "nodes": args.nodes, "sim_hosts": args.hosts,
          "shared_gateways": args.shared_gateways,
          "profile": args.profile, "window_s": args.window,
          "pinning": {"control_plane_cpus": cpu_list(cpus[0]), "fleet_cpus": cpu_list(cpus[1]),
                      "control_plane": [*CONTROL_PLANE, "prometheus"], "fleet": list(FLEET),
                      "unpinned": ["postgresql", "redis"]} if cpus else None,
          "backends": runs,
          "goals": {backend: goals(doc) for backend, doc in runs.items()},
          "machine": {"cpu_count": os.cpu_count(), "load_avg_end": os.getloadavg()}})


def run_backend(args, sizes: list[int], backend: str, secret: str, cpus) -> dict:
    """The whole run for one metrics backend, on a fresh database and broker: the stack, each size, a pool scale,
    RSS over --duration, the page. With `prometheus`, a real Prometheus scrapes the fleet (http_sd, Tandem's
    recording rules) and the control plane reads from it and scrapes nothing. `cpus`: (control plane, fleet) CPU
    sets, or None to leave every process on every CPU."""
    from controlplane.run.stack import Stack
    from inference.models import DEFAULT_MODELS_DIR

    print(f"--- backend {backend}", file=sys.stderr)
    model = str(DEFAULT_MODELS_DIR / "tiny")  # a model folder for validation: simulated workers never load it
    fresh_services(args.database_url, args.broker_url)
    var_dir = Path(tempfile.mkdtemp(prefix=f"tandem-simfleet-{backend}-"))
    web_port, prometheus_port = free_port(), free_port()
    shards = max(1, args.periodic_workers)  # one scrape shard per periodic worker, as docs/operating.md advises
    env = stack_env(args, backend, secret, var_dir=var_dir, web_port=web_port, prometheus_port=prometheus_port,
                    shards=shards)
    manage(env, "migrate", "--verbosity", "0")
    token = manage(env, "tandem_token", "bench-admin", "--role", "admin").strip()
    prometheus = prometheus_token = None
    if backend == "prometheus":
        manage(env, "tandem_recording_rules", "--output", str(var_dir / "tandem-rules.yml"))
        prometheus_token = manage(env, "tandem_token", "prometheus", "--role", "viewer").strip()
    database = DatabaseBackends(args.database_url)
    stack = Stack(stack_specs(args, web_port=web_port, var_dir=var_dir, cpus=cpus), log_dir=var_dir / "logs",
                  env=env, cwd=ROOT, on_event=lambda m: print(m, file=sys.stderr))
    web_url = f"http://127.0.0.1:{web_port}"
    api = Api(web_url, token)
    names = [f"sim-{i:03d}" for i in range(args.deployments)]
    doc: dict = {"backend": backend, "interval_s": args.interval,
                 "scrape_shards": shards if backend != "prometheus" else 0, "sizes": []}
    stack.start()
    try:
        wait("the web server", lambda: answers(web_url + "/healthz"), timeout=120, poll=stack.poll)
        if prometheus_token is not None:  # it asks the web server for the gateways' scrape token
            with affinity(cpus[0] if cpus else None):  # Prometheus shares the control plane's CPUs
                prometheus = PrometheusProcess(
                    var_dir / "prometheus", port=prometheus_port, rules=var_dir / "tandem-rules.yml",
                    targets_url=f"{web_url}/api/v1/prometheus/targets", interval_s=args.interval,
                    token=prometheus_token)
        wait(f"{args.nodes} simulated nodes", lambda: len(api.ok("GET", "nodes/")) >= args.nodes, timeout=300,
             poll=stack.poll)
        for index, size in enumerate(sizes):
            per_role = split(size // args.deployments)
            started = time.monotonic()
            if index == 0:
                deploy(api, names, per_role, model, args.profile)
                if args.shared_gateways:
                    share(api, names, args.shared_gateways)
                    wait(f"{args.shared_gateways} shared gateways and no other", lambda: gateway_rows(api) == (
                        args.shared_gateways, 0), timeout=300, interval=2.0, poll=stack.poll)
            else:
                scale_all(api, names, per_role)
            want = size // args.deployments * args.deployments
            wait(f"{want} ready workers", lambda: sum(v for k, v in worker_counts(api).items() if k != "gateway")
                 >= want, timeout=1800, interval=2.0, poll=stack.poll)
            ready_s = time.monotonic() - started
            if prometheus is not None:  # Prometheus scrapes what http_sd lists (refreshed every 15 s)
                wait("Prometheus to scrape every target", lambda: (prometheus.scalar("sum(up)") or 0) >= len(
                    api.ok("GET", "prometheus/targets")), timeout=300, interval=2.0, poll=stack.poll)
            print(f"size {want}: ready in {ready_s:.0f} s; measuring {args.window:.0f} s", file=sys.stderr)
            time.sleep(2 * args.interval)  # the passes of the start-up burst are done
            entry = {"workers": want, "per_deployment": per_role, "all_ready_s": round(ready_s, 1),
                     **measure_window(stack, api, args.window, args.interval, shards, prometheus, database)}
            doc["sizes"].append(entry)
            print(json.dumps({k: entry[k] for k in ("workers", "keeps_cycle", "cycles", "cpu_by_side")}),
                  file=sys.stderr)
        doc["largest_fleet_keeping_cycle"] = max((e["workers"] for e in doc["sizes"] if e["keeps_cycle"]),
                                                 default=None)
        try:
            doc["pool_scale"] = measure_scale(api, names[0], stack)
        except SystemExit as exc:  # a scale that never became ready is a figure too; the rest is still measured
            doc["pool_scale"] = {"deployment": names[0], "error": str(exc), "goal_s": SCALE_GOAL_S,
                                 "meets_goal": False}
        print(f"pool scale: {doc['pool_scale']}", file=sys.stderr)
        doc["rss"] = sample_rss(stack, args.duration)
        if not args.skip_page:
            try:
                doc["deployment_page"] = measure_page(env, web_url, names[0], prometheus=prometheus,
                                                      folder=var_dir / "backfill")
            except Exception as exc:  # the figures above are still worth printing
                doc["deployment_page"] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"deployment page: {doc['deployment_page']}", file=sys.stderr)
        return doc
    finally:
        database.close()
        stop_stack(stack)
        if prometheus is not None:
            prometheus.stop()
        shutil.rmtree(var_dir / "prometheus", ignore_errors=True)  # a day of blocks and the WAL: not worth keeping


if __name__ == "__main__":
    main()
