"""What one simulated worker costs its host in CPU: idle, asked as the control plane asks, and probed as its gateway
probes it.

A simulated worker host (`python -m inference.worker.sim_host`) is started with --workers simulated workers (half
prefill, half decode, each with a worker secret, as the simulated fleet starts them), and its CPU seconds are read
from /proc/<pid>/stat over three phases of --seconds each:

- idle: nobody asks anything;
- cycle: every --interval each worker's /health and /metrics, all workers at once over connections kept open (the
  control plane's health and scrape passes);
- probed: the cycle, plus each worker's /health every --probe-interval (what its deployment's gateway asks).

For each phase: the host's cores (CPU s / wall s), the cost per worker in millicores, the requests answered and,
above idle, CPU microseconds per request. With --baseline DIR (a tree holding an earlier `inference/`, e.g. from
`git archive <commit> inference | tar -x -C DIR`) the same is measured for that tree's host first, then this one's,
--rounds times in turn, so that both meet the same load on a shared machine. With two CPUs or more the host runs on
one CPU set and this client on the other (bench/lib/fleet_cpu.py), so that asking does not slow the answering.

    python bench/fleet/sim_host_cost.py --workers 200 --seconds 60
    python bench/fleet/sim_host_cost.py --workers 200 --seconds 30 --baseline /tmp/simhost-before
"""
from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import ROOT, emit  # noqa: E402
from bench.lib.fleet_api import answers, wait  # noqa: E402
from bench.lib.fleet_cpu import cpu_list, cpu_sets, pinned, proc_cpu_seconds  # noqa: E402

PHASES = ("idle", "cycle", "probed")
CONCURRENCY = 64  # requests in flight at once, as a pass bounds its own


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=200)
    p.add_argument("--seconds", type=float, default=60.0, help="length of each phase")
    p.add_argument("--interval", type=float, default=5.0, help="the control plane's cycle (health and scrape)")
    p.add_argument("--probe-interval", type=float, default=1.0, help="the gateway's health probes")
    p.add_argument("--profile", default="tiny-cpu")
    p.add_argument("--baseline", type=Path, help="a tree holding an earlier inference/ package, measured in turn")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--no-pin", dest="pin", action="store_false", help="leave host and client on every CPU")
    return p.parse_args(argv)


def free_ports(count: int) -> list[int]:
    """`count` distinct ports nothing listens on now (all bound at once, so the kernel cannot repeat one)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def start_host(tree: Path, cpus: set[int] | None, log_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_ports(1)[0]
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONUNBUFFERED": "1"}
    log = open(log_dir / f"simhost-{tree.name}.log", "ab")
    proc = subprocess.Popen(pinned([sys.executable, "-m", "inference.worker.sim_host", "--port", str(port)], cpus),
                            cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait("the simulated worker host", lambda: proc.poll() is None and answers(url + "/health"), timeout=60)
    return proc, url


def start_workers(url: str, count: int, profile: str) -> list[str]:
    import requests

    urls = []
    for i, port in enumerate(free_ports(count)):
        role = "prefill" if i % 2 == 0 else "decode"
        argv = ["--simulate", profile, "--role", role, "--model", "/m/sim", "--port", str(port), "--revision", "1"]
        r = requests.post(url + "/workers", json={"id": f"w{i}", "argv": argv, "secret": "bench-secret"}, timeout=30)
        if r.status_code != 200:
            raise SystemExit(f"starting worker {i} answered {r.status_code}: {r.text[:300]}")
        urls.append(f"http://127.0.0.1:{port}")
    return urls


class Asker:
    """Asks the workers over one client session, its connections kept open across phases (as the control plane's
    and the gateways' are)."""

    def __init__(self, workers: list[str]):
        import aiohttp

        self.workers = workers
        self.limit = asyncio.Semaphore(CONCURRENCY)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=600),
            timeout=aiohttp.ClientTimeout(total=30))
        self.num_answers = 0
        self.errors: list[str] = []

    async def get(self, url: str) -> None:
        import aiohttp

        async with self.limit:
            try:
                async with self.session.get(url) as r:
                    await r.read()
                    if r.status != 200:
                        raise aiohttp.ClientError(f"answered {r.status}")
                    self.num_answers += 1
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.errors.append(f"GET {url}: {type(exc).__name__}: {exc}")

    async def round(self, paths: tuple[str, ...]) -> None:
        await asyncio.gather(*(self.get(w + path) for w in self.workers for path in paths))

    async def every(self, period: float, paths: tuple[str, ...]) -> None:
        started, tick = time.monotonic(), 0
        while True:
            await self.round(paths)
            tick += 1
            await asyncio.sleep(max(0.0, started + tick * period - time.monotonic()))

    async def phase(self, phase: str, seconds: float, interval: float, probe_interval: float) -> int:
        """Ask as `phase` says for `seconds`; how many answers came back (each a 200; `errors` says what failed)."""
        self.num_answers, self.errors = 0, []
        tasks = []
        if phase != "idle":
            tasks.append(asyncio.create_task(self.every(interval, ("/health", "/metrics"))))
        if phase == "probed":
            tasks.append(asyncio.create_task(self.every(probe_interval, ("/health",))))
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return self.num_answers


async def measure_phases(pid: int, workers: list[str], args) -> dict:
    asker = Asker(workers)
    try:
        await asker.round(("/health", "/metrics"))  # connections opened before anything is measured
        await asyncio.sleep(2.0)
        out = {}
        for phase in PHASES:
            cpu_before, started = proc_cpu_seconds(pid), time.monotonic()
            num = await asker.phase(phase, args.seconds, args.interval, args.probe_interval)
            cpu, wall = proc_cpu_seconds(pid) - cpu_before, time.monotonic() - started
            out[phase] = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 2), "host_cores": round(cpu / wall, 4),
                          "millicores_per_worker": round(1000 * cpu / wall / args.workers, 4),
                          "requests": num, "requests_per_s": round(num / wall, 1),
                          "num_errors": len(asker.errors), "first_errors": asker.errors[:3]}
        return out
    finally:
        await asker.session.close()


def measure_tree(tree: Path, args, host_cpus, log_dir: Path) -> dict:
    proc, url = start_host(tree, host_cpus, log_dir)
    try:
        workers = start_workers(url, args.workers, args.profile)
        out = asyncio.run(measure_phases(proc.pid, workers, args))
        idle = out["idle"]["host_cores"]
        for phase in PHASES[1:]:
            above = (out[phase]["host_cores"] - idle) * out[phase]["wall_s"]
            out[phase]["cpu_us_per_request_above_idle"] = round(1e6 * above / max(1, out[phase]["requests"]), 1)
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv=None) -> None:
    args = parse_args(argv)
    sets = cpu_sets() if args.pin else None
    client_cpus, host_cpus = sets if sets else (None, None)
    if client_cpus is not None:
        os.sched_setaffinity(0, client_cpus)
    trees = {"current": ROOT}
    if args.baseline is not None:
        if not (args.baseline / "inference" / "worker" / "sim_host.py").is_file():
            raise SystemExit(f"--baseline {args.baseline} holds no inference/worker/sim_host.py")
        trees = {"baseline": args.baseline.resolve(), **trees}
    log_dir = Path(tempfile.mkdtemp(prefix="tandem-simhost-cost-"))
    runs: dict[str, list] = {name: [] for name in trees}
    for round_index in range(args.rounds):
        for name, tree in trees.items():
            print(f"round {round_index + 1}: {name} ({tree})", file=sys.stderr)
            runs[name].append(measure_tree(tree, args, host_cpus, log_dir))
    emit({"bench": "sim_host_cost", "workers": args.workers, "phase_s": args.seconds, "interval_s": args.interval,
          "probe_interval_s": args.probe_interval, "profile": args.profile,
          "pinning": {"host": cpu_list(host_cpus) if host_cpus else None,
                      "client": cpu_list(client_cpus) if client_cpus else None},
          "runs": runs, "logs": str(log_dir),
          "machine": {"cpu_count": os.cpu_count(), "load_avg_end": os.getloadavg()}})


if __name__ == "__main__":
    main()
