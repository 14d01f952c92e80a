"""The stack bench/fleet/sim_fleet.py measures: a scratch PostgreSQL database and Redis, the control plane's own
processes as `make run` starts them (with Celery workers of their own for `periodic` and, with --web gunicorn,
production's web tier), and `manage.py tandem_simfleet` in the node agent's place: simulated nodes whose workers live
in simulated worker hosts."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bench.lib.common import ROOT
from bench.lib.fleet_cpu import pinned
from bench.lib.fleet_measure import control_processes


def _with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def fresh_services(database_url: str, broker_url: str) -> None:
    import psycopg
    import redis

    name = urlsplit(database_url).path.lstrip("/")
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name) or name == "test":
        raise SystemExit(f"--database-url must name a scratch database other than test, got {name!r}")
    with psycopg.connect(_with_path(database_url, "/test"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    redis.Redis.from_url(broker_url).flushdb()


class DatabaseBackends:
    """The PostgreSQL backends serving the bench's database (pg_stat_activity), asked over a connection to another
    database of the same server, so that the asking is not counted."""

    def __init__(self, database_url: str):
        import psycopg

        self.name = urlsplit(database_url).path.lstrip("/")
        self.conn = psycopg.connect(_with_path(database_url, "/test"), autocommit=True)

    def pids(self) -> list[int]:
        return [row[0] for row in self.conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                                                    (self.name,)).fetchall()]

    def close(self) -> None:
        self.conn.close()


def manage(env: dict, *args: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    if done.returncode:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stack_env(args, backend: str, secret: str, *, var_dir: Path, web_port: int, prometheus_port: int,
              shards: int) -> dict:
    """The environment of every process of the stack: the bench's services, one interval for every periodic pass,
    production's settings, and the metrics backend."""
    interval = str(args.interval)
    env = {**os.environ, "DATABASE_URL": args.database_url, "CELERY_BROKER_URL": args.broker_url,
           "TANDEM_VAR_DIR": str(var_dir), "TANDEM_WEB_PORT": str(web_port),
           "TANDEM_PUBLIC_URL": f"http://127.0.0.1:{web_port}", "TANDEM_RECONCILE_INTERVAL_S": interval,
           "TANDEM_SCRAPE_INTERVAL_S": interval, "TANDEM_SCRAPE_SHARDS": str(shards),
           "TANDEM_ALERT_EVAL_INTERVAL_S": interval,
           "TANDEM_HEARTBEAT_INTERVAL_S": interval, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "TANDEM_DB_CONN_MAX_AGE": str(args.conn_max_age),
           # As in production (docs/operating.md): with DEBUG on every database connection keeps its last 9,000 queries.
           "DJANGO_DEBUG": "1" if args.debug else "0", "SECRET_KEY": secret,
           "ALLOWED_HOSTS": "127.0.0.1,localhost", "SECURE_SSL_REDIRECT": "0",
           # The chart cache in Redis, as with several web processes, so that the page timing can empty it.
           "TANDEM_CACHE_URL": args.cache_url,
           # An idle pool reads as "shrink" (no traffic here: TTFT read as 0 against a target of 1 s). A tolerance of
           # 100% keeps every pool at its size while the autoscaler still evaluates each one every cycle. (A day of
           # down-stabilization did not: the bench's own scales pause the autoscaler, and the recommendations it
           # kept from before the pause were all "shrink", so it shrank the pools as the pause ended.)
           "TANDEM_AUTOSCALE_TOLERANCE_PCT": "100",
           "TANDEM_METRICS_BACKEND": backend}
    if backend == "prometheus":
        env["TANDEM_PROMETHEUS_URL"] = f"http://127.0.0.1:{prometheus_port}"
    env.pop("CELERY_TASK_ALWAYS_EAGER", None)
    return env


def stack_specs(args, *, web_port: int, var_dir: Path, cpus: tuple[set[int], set[int]] | None = None) -> list:
    """`make run`'s children, changed as the arguments ask: the web tier, the Celery workers (`control` alone, and
    `periodic` ones beside it), and the simulated fleet in the node agent's place. With `cpus` (control plane,
    fleet: bench/lib/fleet_cpu.py) each is pinned to its side's set; the fleet's hosts and gateways, which the fleet
    agent spawns, inherit its set."""
    from controlplane.run.stack import ChildSpec, child_specs

    specs = child_specs(web_port=web_port, node_name="sim", var_dir=var_dir, embedded_beat=False)
    if args.web == "gunicorn":  # as in production (docs/operating.md): threads that live and keep their DB connection
        specs[0] = ChildSpec("web", [sys.executable, "-m", "gunicorn", "controlplane.wsgi", "-b",
                                     f"127.0.0.1:{web_port}", "-w", "2", "-k", "gthread", "--threads", "8",
                                     "--timeout", "120"], stop_deadline_s=20)
    specs[1].argv[specs[1].argv.index("--concurrency") + 1] = str(args.control_concurrency)
    if args.periodic_workers:
        specs[1].argv[specs[1].argv.index("--queues") + 1] = "control"
    for index in range(args.periodic_workers):
        argv = list(specs[1].argv)
        argv[argv.index("--queues") + 1] = "periodic"
        argv[argv.index("--hostname") + 1] = f"periodic{index}.sim@%h"
        specs.insert(2 + index, ChildSpec(f"periodic{index}", argv, stop_deadline_s=20))
    specs[-1] = ChildSpec("agent", [sys.executable, str(ROOT / "manage.py"), "tandem_simfleet", "--nodes",
                                    str(args.nodes), "--hosts", str(args.hosts), "--prefix", "sim",
                                    "--concurrency", "16"], stop_deadline_s=30)
    if cpus is not None:
        for spec in specs:
            spec.argv = pinned(spec.argv, cpus[1] if spec.name == "agent" else cpus[0])
    return specs


def stop_stack(stack) -> None:
    """Every process of the stack, the gateways the fleet agent started included (they outlive it)."""
    stack.stop(["agent", "beat", *(name for name in stack.children if name.startswith(("control", "periodic")))])
    _stop_gateways(stack)
    stack.stop(["web"])


def _stop_gateways(stack) -> None:
    """The fleet agent starts each deployment's gateway in its own session (as real workers are, to outlive it)."""
    import signal

    for proc in control_processes(stack).get("gateways", []):
        try:
            proc.send_signal(signal.SIGTERM)
        except Exception:
            pass
