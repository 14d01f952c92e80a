"""The control plane's HTTP to a thousand simulated workers: a pass with new connections against a pass over the
connections the previous pass kept open (controlplane.lib.fleet_http), for the scrape (/metrics) and health (/health)
passes, in one run on the same fleet.

Simulated workers (`inference.worker.sim_host`: several hosts, each carrying many workers on ports of their own,
with real aiohttp servers) answer /metrics and /health as the sim fleet's do. Then, alternating, --passes times each:

- scrape, before: a new aiohttp session per pass (what scraper.scrape did: every pass opens a connection to every
  worker), with the same concurrency bound;
- scrape, now: scraper.scrape, over the process's kept-alive session;
- health, before: 32 threads of blocking `requests` over one shared Session (what health.check_health did);
- health, now: health.probe_all, asynchronous over the same kept-alive session.

Per pass: wall seconds, CPU seconds of this process (the control plane's side) and of the worker hosts (the
fleet's side: accepting connections costs them too). Medians, and now/before ratios. No database: the passes'
HTTP and parsing only (store.py's writes are the same either way).

    python bench/controlplane/connection_reuse.py         # 1,000 workers on 4 hosts, 5 passes of each
    python bench/controlplane/connection_reuse.py --workers 200 --passes 3
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import emit, environment, setup_django  # noqa: E402

CONCURRENCY = 100  # settings.TANDEM_SCRAPE_CONCURRENCY's default
TIMEOUT_S = 3.0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=1000)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--passes", type=int, default=5)
    return p.parse_args(argv)


def start_fleet(num_workers: int, num_hosts: int, log_dir: Path):
    import requests

    from tests.procs import free_port, start, wait_http

    hosts = []
    for index in range(num_hosts):
        port = free_port()
        proc = start(f"simhost{index}", ["-m", "inference.worker.sim_host", "--port", str(port), "--index",
                                         str(index)], log_dir)
        proc.url = f"http://127.0.0.1:{port}"
        wait_http(proc, proc.url + "/health", timeout=60)
        hosts.append(proc)
    workers = []
    session = requests.Session()
    for i in range(num_workers):
        port = free_port()
        role = ("prefill", "decode")[i % 2]
        host = hosts[i % num_hosts]
        answer = session.post(host.url + "/workers", timeout=30, json={"id": f"w{i}", "argv": [
            "--simulate", "tiny-cpu", "--role", role, "--model", "/m/sim", "--port", str(port), "--revision", "1"]})
        answer.raise_for_status()
        workers.append(SimpleNamespace(id=i, pid=answer.json()["pid"], role=role, url=f"http://127.0.0.1:{port}"))
    return hosts, workers


def cpu_of(pids: list[int]) -> float:
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks  # utime + stime
    return total


def scrape_fresh_session(targets):
    """The scrape before: a session (and so a connection to every worker) per pass."""
    import aiohttp

    from controlplane.observability.scraper import fetch_all, parse_all

    async def run():
        connector = aiohttp.TCPConnector(limit=CONCURRENCY, limit_per_host=CONCURRENCY)
        async with aiohttp.ClientSession(connector=connector) as session:
            return await fetch_all(session, targets, timeout_s=TIMEOUT_S, concurrency=CONCURRENCY)

    return parse_all(asyncio.run(run()))


_threads_session = None


def health_threads(workers):
    """The health pass before: 32 threads of blocking requests, one shared keep-alive Session."""
    import requests

    global _threads_session
    if _threads_session is None:
        _threads_session = requests.Session()
        _threads_session.mount("http://", requests.adapters.HTTPAdapter(pool_connections=4096, pool_maxsize=2))

    def probe(worker):
        try:
            return _threads_session.get(worker.url + "/health", timeout=TIMEOUT_S).status_code == 200
        except requests.RequestException:
            return False

    with ThreadPoolExecutor(max_workers=32) as pool:
        return list(pool.map(probe, workers))


def timed(fn, host_pids):
    wall, cpu, hosts_cpu = time.perf_counter(), time.process_time(), cpu_of(host_pids)
    ok = fn()
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
            "hosts_cpu_s": cpu_of(host_pids) - hosts_cpu, "ok": ok}


def main(argv=None) -> None:
    args = parse_args(argv)
    setup_django(tempfile.mkdtemp(prefix="tandem-fleet-http-db-"), None)  # health's module imports the models
    from controlplane.lib.fleet_http import fleet_http
    from controlplane.observability.scraper import Target, scrape
    from controlplane.supervision.health import probe_all

    with tempfile.TemporaryDirectory(prefix="tandem-fleet-http-") as tmp:
        hosts, workers = start_fleet(args.workers, args.hosts, Path(tmp))
        try:
            host_pids = [h.popen.pid for h in hosts]
            targets = [Target(w.id, 1, w.role, w.url) for w in workers]
            kinds = {
                "scrape_before": lambda: sum(f.reading is not None for f in scrape_fresh_session(targets)),
                "scrape_now": lambda: sum(f.reading is not None for f in scrape(
                    targets, timeout_s=TIMEOUT_S, concurrency=CONCURRENCY)),
                "health_before": lambda: sum(health_threads(workers)),
                "health_now": lambda: sum(p.ok for p in probe_all(workers, TIMEOUT_S)),
            }
            for fn in kinds.values():
                fn()  # warm-up: the kept-alive kinds open their connections here
            runs = {kind: [] for kind in kinds}
            for _ in range(args.passes):
                for kind, fn in kinds.items():
                    runs[kind].append(timed(fn, host_pids))
            open_connections = fleet_http().open_connections()
        finally:
            for host in hosts:
                host.stop()
    summary = {kind: {key: round(statistics.median(r[key] for r in passes), 3)
                      for key in ("wall_s", "cpu_s", "hosts_cpu_s")} | {"answered": min(r["ok"] for r in passes)}
               for kind, passes in runs.items()}
    ratios = {stage: {key: round(summary[f"{stage}_now"][key] / summary[f"{stage}_before"][key], 3)
                      for key in ("wall_s", "cpu_s", "hosts_cpu_s") if summary[f"{stage}_before"][key] > 0}
              for stage in ("scrape", "health")}
    emit({"bench": "connection_reuse", "workers": args.workers, "hosts": args.hosts, "passes": args.passes,
          "concurrency": CONCURRENCY, "median_per_pass": summary, "now_over_before": ratios,
          "kept_alive_connections": open_connections, "load_avg": os.getloadavg(), "environment": environment()})


if __name__ == "__main__":
    main()
