"""Hostile load: do a few bad requests a second cost the other clients anything?

A tiny-model deployment (disaggregated: one prefill and one decode worker; or one colocated worker) behind the
gateway, real processes. Normal clients (greedy, non-streamed, 16 tokens) send requests back to back through quiet
windows alternating with hostile ones, in which a hostile client sends 2 requests a second that any anonymous client
can send
(lone UTF-16 surrogates, JSON nested 5,000 deep: tests.inference.gateway.support.HOSTILE_REQUESTS). Before the fix,
each of those made a worker answer 500 and the gateway eject it for about a second, so two a second kept the
deployment at zero successful requests.

Goals: successful requests per second during >= 0.9x before; every hostile request answered 4xx within 100 ms; every
worker still in rotation at the end. Prints one JSON document.

    python tests/reliability/hostile_load.py [--mode disaggregated|colocated] [--seconds 5] [--rounds 6] [--clients 4]
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent.parent
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from tests.inference.gateway.support import (  # noqa: E402
    HOSTILE_REQUESTS, start_gateway, start_workers, stop_all, worker_states)

GOAL_RATIO = 0.9
GOAL_HOSTILE_MS = 100.0
HOSTILE_PER_S = 2.0
PROMPTS = ["Once upon a time", "Permission is hereby granted", "The quick brown fox", "In the beginning"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["disaggregated", "colocated"], default="disaggregated")
    p.add_argument("--model", default=str(ROOT / "var" / "models" / "tiny"), help="a model folder")
    p.add_argument("--seconds", type=float, default=5.0, help="length of each measured window")
    p.add_argument("--rounds", type=int, default=6, help="pairs of quiet and hostile windows")
    p.add_argument("--clients", type=int, default=4, help="normal clients sending back to back")
    return p.parse_args(argv)


class NormalClients:
    """`num_clients` threads sending greedy completions back to back; counts answers per phase."""

    def __init__(self, gateway_url: str, num_clients: int) -> None:
        self.url = gateway_url + "/v1/completions"
        self.phase = "warmup"
        self.counts: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(num_clients)]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _run(self, index: int) -> None:
        session = requests.Session()
        for i in itertools.count():
            if self._stop.is_set():
                return
            body = {"model": "tandem", "prompt": PROMPTS[(index + i) % len(PROMPTS)], "max_tokens": 16,
                    "temperature": 0, "ignore_eos": True}
            phase = self.phase
            try:
                ok = session.post(self.url, json=body, timeout=60).status_code == 200
            except requests.RequestException:
                ok = False
            if phase != self.phase:  # straddled two windows: counted in neither
                continue
            with self._lock:
                counts = self.counts.setdefault(phase, {"succeeded": 0, "failed": 0})
                counts["succeeded" if ok else "failed"] += 1


def send_hostile(gateway_url: str, seconds: float) -> list[dict]:
    """HOSTILE_PER_S requests a second for `seconds`, each on its own thread (a slow answer must not slow the rate)."""
    results: list[dict] = []
    threads = []

    def one(name: str, path: str, raw: bytes) -> None:
        started = time.perf_counter()
        try:
            resp = requests.post(gateway_url + path, data=raw, headers={"Content-Type": "application/json"},
                                 timeout=30)
            status, code = resp.status_code, (resp.json().get("error") or {}).get("code")
        except (requests.RequestException, ValueError) as exc:
            status, code = None, type(exc).__name__
        results.append({"name": name, "status": status, "code": code,
                        "ms": (time.perf_counter() - started) * 1000})

    deadline = time.monotonic() + seconds
    next_at = time.monotonic()
    for name, path, raw in itertools.cycle(HOSTILE_REQUESTS):
        if next_at >= deadline:
            break
        time.sleep(max(0.0, next_at - time.monotonic()))
        thread = threading.Thread(target=one, args=(name, path, raw), daemon=True)
        thread.start()
        threads.append(thread)
        next_at += 1.0 / HOSTILE_PER_S
    time.sleep(max(0.0, deadline - time.monotonic()))
    for thread in threads:
        thread.join(60)
    return results


def measure(gateway_url: str, *, seconds: float, rounds: int, num_clients: int) -> dict:
    """Alternate quiet and hostile windows of `seconds`, `rounds` times each, so that drift in the machine's load
    (other processes share it) hits both alike; "before" sums the quiet windows, "during" the hostile ones."""
    clients = NormalClients(gateway_url, num_clients)
    clients.start()
    hostile: list[dict] = []
    elapsed = {"before": 0.0, "during": 0.0}
    try:
        time.sleep(min(3.0, seconds))  # warm-up: connections, first requests
        for _ in range(rounds):
            clients.phase, started = "before", time.monotonic()
            time.sleep(seconds)
            clients.phase, switched = "during", time.monotonic()
            elapsed["before"] += switched - started
            hostile += send_hostile(gateway_url, seconds)
            clients.phase = "between"
            elapsed["during"] += time.monotonic() - switched
    finally:
        clients.stop()
    before, during = clients.counts.get("before", {}), clients.counts.get("during", {})
    rps_before = before.get("succeeded", 0) / elapsed["before"]
    rps_during = during.get("succeeded", 0) / elapsed["during"]
    latencies = sorted(r["ms"] for r in hostile)
    statuses: dict[str, int] = {}
    for r in hostile:
        statuses[str(r["status"])] = statuses.get(str(r["status"]), 0) + 1
    all_4xx = all(r["status"] is not None and 400 <= r["status"] < 500 for r in hostile)
    states = worker_states(gateway_url)
    in_rotation = all(state == "ready" for state, _ in states.values())
    ratio = rps_during / rps_before if rps_before else 0.0
    return {
        "normal": {"clients": num_clients, "windows": f"{rounds} quiet + {rounds} hostile, {seconds:g} s each",
                   "before": {**before, "requests_per_s": round(rps_before, 2)},
                   "during": {**during, "requests_per_s": round(rps_during, 2)},
                   "ratio": round(ratio, 3), "goal_ratio": GOAL_RATIO},
        "hostile": {"sent": len(hostile), "per_s": HOSTILE_PER_S, "statuses": statuses,
                    "codes": sorted({str(r["code"]) for r in hostile}), "all_4xx": all_4xx,
                    "latency_ms": {"p50": round(statistics.median(latencies), 1) if latencies else None,
                                   "p95": round(latencies[int(0.95 * (len(latencies) - 1))], 1) if latencies else None,
                                   "max": round(latencies[-1], 1) if latencies else None},
                    "num_within_goal": sum(ms <= GOAL_HOSTILE_MS for ms in latencies), "goal_ms": GOAL_HOSTILE_MS},
        "workers_in_rotation_after": in_rotation,
        "goals_met": bool(ratio >= GOAL_RATIO and all_4xx and in_rotation and latencies
                          and latencies[-1] <= GOAL_HOSTILE_MS),
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    model_dir = Path(args.model)
    with tempfile.TemporaryDirectory(prefix="hostile-load-") as tmp:
        log_dir = Path(tmp)
        specs = [("prefill", "prefill"), ("decode", "decode")] if args.mode == "disaggregated" \
            else [("colocated", "colocated")]
        workers = start_workers(specs, model_dir, log_dir)
        procs = list(workers)
        try:
            flags = (["--prefill", workers[0].url, "--decode", workers[1].url] if args.mode == "disaggregated"
                     else ["--colocated", workers[0].url])
            gateway = start_gateway("gateway", flags, log_dir)
            procs.append(gateway)
            figures = measure(gateway.url, seconds=args.seconds, rounds=args.rounds, num_clients=args.clients)
        finally:
            stop_all(procs)
    print(json.dumps({"benchmark": "hostile_load", "mode": args.mode, "model": model_dir.name, **figures}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
