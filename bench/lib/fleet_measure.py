"""Measurements of bench/fleet/sim_fleet.py that read processes and pages rather than the control plane's counters:
which processes make up the control plane and their CPU and RSS, RSS over a run, and the deployment page with a day of
data (bench/controlplane/dashboard_page's seeding) over real HTTP."""
from __future__ import annotations

import os
import statistics
import time

PAGE_GOAL_MS = 300.0


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
            procs["sim_hosts"] = [c for c in proc.children() if "inference.worker.sim.host" in " ".join(c.cmdline())]
    gateways = []
    for proc in psutil.process_iter(["cmdline", "environ"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "inference.gateway" in cmd and (proc.info["environ"] or {}).get("TANDEM_VAR_DIR") == stack.env[
                "TANDEM_VAR_DIR"]:
            gateways.append(proc)
    procs["gateways"] = gateways
    return procs


def cpu_seconds(procs: dict[str, list]) -> dict[str, float]:
    import psutil

    out = {}
    for name, group in procs.items():
        total = 0.0
        for proc in group:
            try:
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
            except psutil.NoSuchProcess:
                pass
        out[name] = total
    return out


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


def measure_page(env: dict, web_url: str, name: str, repeat: int = 5) -> dict:
    """A day of series for one deployment (bench/controlplane/dashboard_page's seeding), then its page and 24 h charts
    over real HTTP as a logged-in viewer."""
    import requests

    # The web server's settings, SECRET_KEY included: the session written here must be valid there.
    for key in ("DATABASE_URL", "TANDEM_VAR_DIR", "CELERY_BROKER_URL", "DJANGO_DEBUG", "SECRET_KEY", "ALLOWED_HOSTS",
                "SECURE_SSL_REDIRECT"):
        if key in env:
            os.environ[key] = env[key]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.test import Client

    from bench.controlplane.dashboard_page import seed, settle_tables
    from controlplane.auth import Role, set_role
    from controlplane.models import Deployment, Worker

    deployment = Deployment.objects.get(name=name)
    workers = list(Worker.objects.filter(deployment=deployment, status="ready").exclude(role="gateway"))
    seeded = seed(deployment, workers, time.time())
    seeded.update(settle_tables())
    viewer, _ = get_user_model().objects.get_or_create(username="bench-viewer")
    set_role(viewer, Role.VIEWER)
    client = Client()
    client.force_login(viewer)
    cookies = {"sessionid": client.cookies["sessionid"].value}
    out = {"data": seeded}
    for label, path in (("deployment_page", f"/deployments/{name}/"),
                        ("charts_24h", f"/deployments/{name}/charts.json?range=24h")):
        times = []
        for attempt in range(1 + repeat):  # the first is a warm-up
            started = time.perf_counter()
            r = requests.get(web_url + path, cookies=cookies, timeout=60, allow_redirects=False)
            if attempt:
                times.append((time.perf_counter() - started) * 1000)
            if r.status_code != 200:  # a redirect to the login page would time the wrong page
                raise RuntimeError(f"GET {path} answered {r.status_code}, not the page")
        out[label] = {"median_ms": round(statistics.median(times), 1), "max_ms": round(max(times), 1)}
    out["goal_ms"] = PAGE_GOAL_MS
    out["meets_goal"] = max(out["deployment_page"]["median_ms"], out["charts_24h"]["median_ms"]) <= PAGE_GOAL_MS
    return out
