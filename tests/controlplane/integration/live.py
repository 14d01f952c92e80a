"""A real control-plane stack for integration tests: its own VAR_DIR, database and broker, and the same children
`make run` starts (web, Celery control worker with embedded beat, node agent), driven through real HTTP.

Isolation from other runs on this machine: the SQLite file and the filesystem broker live in the stack's VAR_DIR;
with DATABASE_URL on PostgreSQL a fresh database `tandem_it_<random>` is created and dropped (WITH (FORCE));
with a Redis broker an empty Redis database number is taken and flushed afterwards.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psutil
import requests

from controlplane.run.stack import ChildSpec, Stack, child_specs
from tests.procs import ROOT, free_port

# Fast loops: reconcile, health and heartbeat every second.
FAST_ENV = {
    "TANDEM_RECONCILE_INTERVAL_S": "1",
    "TANDEM_HEARTBEAT_INTERVAL_S": "1",
    "TANDEM_HEALTH_TIMEOUT_S": "2",
    "TANDEM_STOP_DEADLINE_S": "10",
    "TANDEM_DRAIN_GRACE_S": "3",
    "TANDEM_RESTART_BACKOFF_MAX_S": "4",
    "OMP_NUM_THREADS": "1",
    "PYTHONUNBUFFERED": "1",
    "TANDEM_ROLLOUT_INTERVAL_S": "1",  # the rollout driver every second
    "TANDEM_CHAOS_INTERVAL_S": "1",  # the chaos driver every second
    "TANDEM_HOST_MEASURE": "0",  # no roofline benchmark at each agent start (tests/controlplane/agent measures once)
}


def _with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


class IsolatedServices:
    """The database and broker URLs for one stack, created fresh and removed by close()."""

    def __init__(self, var_dir: Path, environ=os.environ):
        self.env: dict[str, str] = {}
        self._drop_db = self._flush_redis = None
        database_url = environ.get("DATABASE_URL", "")
        if database_url.startswith(("postgres://", "postgresql://")):
            import psycopg

            name = f"tandem_it_{secrets.token_hex(4)}"
            with psycopg.connect(database_url, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            self.env["DATABASE_URL"] = _with_path(database_url, "/" + name)

            def drop():
                with psycopg.connect(database_url, autocommit=True) as conn:
                    conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self._drop_db = drop
        elif database_url:
            raise RuntimeError(f"integration stacks support SQLite (default) or PostgreSQL, not {database_url!r}")
        else:
            self.env["DATABASE_URL"] = f"sqlite:///{var_dir / 'tandem.sqlite3'}"
        broker_url = environ.get("CELERY_BROKER_URL", "")
        if broker_url.startswith("redis://"):
            import redis

            for _ in range(20):
                number = secrets.randbelow(15) + 1  # never 0: the default a developer's own stack uses
                url = _with_path(broker_url, f"/{number}")
                client = redis.Redis.from_url(url)
                if client.dbsize() == 0:
                    break
            else:
                raise RuntimeError("no empty Redis database number found for the integration stack")
            self.env["CELERY_BROKER_URL"] = url
            self._flush_redis = client.flushdb
        elif broker_url and not broker_url.startswith("filesystem://"):
            raise RuntimeError(f"integration stacks support the filesystem broker or Redis, not {broker_url!r}")
        # filesystem:// (the default) lives under TANDEM_VAR_DIR/broker by itself.

    def close(self) -> None:
        for cleanup in (self._flush_redis, self._drop_db):
            if cleanup is not None:
                try:
                    cleanup()
                except Exception as exc:  # leave the suite's result alone; say what was left behind
                    print(f"integration cleanup failed: {exc!r}", file=sys.stderr)


def manage(env: dict[str, str], *args: str, timeout: float = 120) -> str:
    result = subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT, timeout=timeout,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


@dataclass
class LiveStack:
    stack: Stack
    env: dict[str, str]
    var_dir: Path
    web_url: str
    token: str
    node_name: str

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", 15)
        headers = {"Authorization": f"Token {self.token}", **kwargs.pop("headers", {})}
        return requests.request(method, f"{self.web_url}/api/v1/{path}", headers=headers, **kwargs)

    def scrape_headers(self) -> dict[str, str]:
        """What reads a gateway's operator routes (/metrics, the fleet in /health and /v1/models): the scrape token
        the control plane hands an operator, as Prometheus sends it."""
        scrape_token = self.api("GET", "prometheus/scrape-token")
        assert scrape_token.status_code == 200, scrape_token.text
        return {"Authorization": f"Bearer {scrape_token.text}"}

    def gateway_metrics(self, gateway_url: str) -> str:
        response = requests.get(f"{gateway_url}/metrics", timeout=10, headers=self.scrape_headers())
        assert response.status_code == 200, response.text
        return response.text

    def workers(self, deployment: str, **filters) -> list[dict]:
        response = self.api("GET", "workers/", params={"deployment": deployment, **filters})
        response.raise_for_status()
        return response.json()

    def actions(self, deployment: str, **filters) -> list[dict]:
        response = self.api("GET", "actions/", params={"deployment": deployment, "page_size": 500, **filters})
        response.raise_for_status()
        return response.json()["results"]

    def action(self, action_id: int) -> dict:
        response = self.api("GET", f"actions/{action_id}/")
        response.raise_for_status()
        return response.json()

    def logs(self) -> str:
        chunks = []
        for path in sorted((self.var_dir / "logs").glob("*.log")):
            text = path.read_text(errors="replace")
            chunks.append(f"--- {path.name}\n{text[-3000:]}")
        return "\n".join(chunks)

    def wait_for(self, what: str, predicate, timeout: float = 90, interval: float = 0.3):
        """Poll predicate() until it returns something truthy; fail with the stack's logs at the deadline."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            self.stack.poll()
            try:
                last = predicate()
            except requests.RequestException as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})\n{self.diagnose()}"
                             f"\n{self.logs()}")

    def diagnose(self) -> str:
        """What each child of the stack is doing: its state (a `stopped` or `zombie` child explains a silent log)
        and, for the Celery children (control, agent), every thread's stack: SIGUSR1 makes a Celery worker print
        them to its log (its `cry` handler), which is read back here."""
        lines = ["--- the stack's children"]
        for name, child in self.stack.children.items():
            pid = self.stack.pid(name)
            try:
                process = psutil.Process(pid)
                # A create time a whole second off its record: the wall clock was stepped (btime moved), which
                # makes adopted workers look dead to a check that compares create times (processes.is_alive).
                off_s = process.create_time() - child.handle.create_time
                lines.append(f"{name}: pid {pid} {process.status()}, {process.num_threads()} threads, "
                             f"cpu {sum(process.cpu_times()[:2]):.1f} s, up {time.time() - process.create_time():.0f} s"
                             f", create time {off_s:+.2f} s off its record")
            except (psutil.Error, TypeError, ValueError, AttributeError) as exc:
                lines.append(f"{name}: pid {pid}: {exc!r}")
                continue
            if name not in ("control", "agent") or process.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE):
                continue
            log_path = child.log_path
            size = log_path.stat().st_size if log_path.exists() else 0
            process.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and (not log_path.exists() or log_path.stat().st_size == size):
                time.sleep(0.1)
            time.sleep(0.5)  # the rest of the dump
            with open(log_path, "rb") as f:
                f.seek(size)
                lines.append(f"--- {name}'s threads (SIGUSR1)\n{f.read(20000).decode(errors='replace')}")
        # A gateway whose token was revoked (each gateway start issues a new one) answers 401s in web.log: is the
        # process on its port the one its row names?
        try:
            listening = {c.laddr.port: c.pid for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
            for row in self.api("GET", "workers/", params={"role": "gateway"}).json():
                lines.append(f"gateway {row['id']}: {row['status']}, pid {row['pid']}, port {row['port']} held by "
                             f"pid {listening.get(row['port'])}")
        except (requests.RequestException, ValueError, KeyError, TypeError, psutil.Error) as exc:
            lines.append(f"gateways: {exc!r}")
        return "\n".join(lines)


def live_stack_start(var_dir: Path, services: IsolatedServices, extra_env: dict | None = None, *,
                     simulated_nodes: int = 0, simulated_hosts: int = 1) -> LiveStack:
    """simulated_nodes: instead of one node agent, a simulated fleet (`manage.py tandem_simfleet`) of that many
    nodes named <node_name>-000, -001, ...; `node_name` is then the fleet's prefix."""
    web_port = free_port()
    node_name = f"it-{secrets.token_hex(3)}"
    env = {**os.environ, **FAST_ENV, **services.env, "TANDEM_VAR_DIR": str(var_dir),
           "TANDEM_WEB_PORT": str(web_port), "TANDEM_PUBLIC_URL": f"http://127.0.0.1:{web_port}",
           "TANDEM_NODE_NAME": node_name, **(extra_env or {})}
    env.pop("CELERY_TASK_ALWAYS_EAGER", None)
    manage(env, "migrate", "--verbosity", "0")
    token = manage(env, "tandem_token", "it-admin", "--role", "admin").strip()
    specs = child_specs(web_port=web_port, node_name=node_name, var_dir=var_dir, embedded_beat=True)
    if simulated_nodes:
        specs[-1] = ChildSpec("agent", [sys.executable, str(ROOT / "manage.py"), "tandem_simfleet", "--nodes",
                                        str(simulated_nodes), "--hosts", str(simulated_hosts), "--prefix", node_name],
                              stop_deadline_s=20)
    stack = Stack(specs, log_dir=var_dir / "logs", env=env, cwd=ROOT, on_event=lambda m: print(m, file=sys.stderr))
    stack.start()
    live = LiveStack(stack=stack, env=env, var_dir=var_dir, web_url=f"http://127.0.0.1:{web_port}", token=token,
                     node_name=node_name)
    live.wait_for("the web server", lambda: requests.get(f"{live.web_url}/healthz", timeout=2).ok, timeout=60)
    # a simulated fleet registers its nodes one after another: wait for every one, not the first
    names = [f"{node_name}-{i:03d}" for i in range(simulated_nodes)] if simulated_nodes else [node_name]
    for name in names:
        live.wait_for(f"node {name} to register",
                      lambda: live.api("GET", f"nodes/{name}/").status_code == 200, timeout=60)
    return live


def live_stack_stop(live: LiveStack) -> None:
    """Stop the stack, then every worker process its agent started (the agent leaves them running by design)."""
    live.stack.stop(["control", "agent"])
    subprocess.run([sys.executable, "-c", (
        "import django; django.setup(); "
        "from controlplane.run.shutdown import node_processes_stop as stop; "
        "from controlplane.models import Node; "
        f"[stop(node_name=n, reason='integration stack stopped') for n in "
        f"Node.objects.filter(name__startswith={live.node_name!r}).values_list('name', flat=True)]")],
        env={**live.env, "DJANGO_SETTINGS_MODULE": "controlplane.settings"}, cwd=ROOT, timeout=60, check=False)
    live.stack.stop(["web"])
