"""How the gateway's weights split traffic: two identical colocated workers behind `python -m inference.gateway`,
first unweighted (the baseline, same run), then with --worker-weight 3 and 1, each under the same steady load
(N clients, each sending its next request when its last one is answered).

Read from the workers' own /metrics: the requests each finished, and the request-seconds each held (the sum of its
request latencies, the integral of how many it held). The rule decides the hold (goal: a ratio within 10% of the
weights' 3); the finished share is the hold times how fast each worker finishes, so a worker slowed by its larger
load finishes a little less than its weight's share (reported, with the goal heavy share 75% ± 10%).

    python bench/gateway/weighted_routing.py --requests 320 --clients 8 --max-tokens 4 32
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import bootstrap, emit, environment, model_dir  # noqa: E402

WEIGHTS = (3, 1)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    p.add_argument("--requests", type=int, default=320, help="requests per load run")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, nargs="+", default=[4, 32], help="one load run per value")
    return p.parse_args(argv)


def _metric(session, worker_url: str, prefix: str) -> float:
    text = session.get(worker_url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


def _counters(session, worker_url: str) -> tuple[float, float]:
    return (_metric(session, worker_url, "tandem_request_success_total{"),
            _metric(session, worker_url, "tandem_e2e_request_latency_seconds_sum{"))


def load_run(gateway_url: str, worker_urls: list[str], *, requests_total: int, clients: int,
             max_tokens: int) -> dict:
    import requests

    body = {"model": "tandem", "prompt": "The quick brown fox", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    with requests.Session() as session:
        before = [_counters(session, url) for url in worker_urls]

    def client(num: int) -> int:
        with requests.Session() as session:
            return sum(session.post(gateway_url + "/v1/completions", json=body, timeout=300).status_code == 200
                       for _ in range(num))

    with ThreadPoolExecutor(clients) as pool:
        num_ok = sum(pool.map(client, [requests_total // clients] * clients))
    with requests.Session() as session:
        after = [_counters(session, url) for url in worker_urls]
    served = [a[0] - b[0] for a, b in zip(after, before)]
    held = [a[1] - b[1] for a, b in zip(after, before)]
    return {"max_tokens": max_tokens, "ok": num_ok, "served": served,
            "heavy_share": round(served[0] / sum(served), 4), "served_ratio": round(served[0] / served[1], 3),
            "held_seconds": [round(h, 2) for h in held], "held_ratio": round(held[0] / held[1], 3),
            "mean_latency_s": [round(h / s, 4) for h, s in zip(held, served)]}


def run(args) -> dict:
    bootstrap()
    from tests.procs import free_port, start, wait_http

    path = model_dir(args.model)
    log_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-weights-"))
    procs, urls = [], []
    results = {}
    try:
        for name in ("heavy", "light"):
            port = free_port()
            procs.append(start(name, ["-m", "inference.worker", "--role", "colocated", "--model", str(path),
                                      "--port", str(port), "--threads", "1"], log_dir))
            urls.append(f"http://127.0.0.1:{port}")
        for proc, url in zip(procs, urls):
            wait_http(proc, f"{url}/health", timeout=180)
        for label, weights in (("baseline_unweighted", ()), ("weighted_3_1", WEIGHTS)):
            port = free_port()
            flags = [arg for url, weight in zip(urls, weights) for arg in ("--worker-weight", f"{url}={weight}")]
            gateway = start(f"gateway-{label}", ["-m", "inference.gateway", "--port", str(port), "--colocated",
                                                 ",".join(urls), *flags,
                                                 # One prompt for all: affinity would send them all to one worker.
                                                 "--no-prefix-affinity"], log_dir)
            try:
                wait_http(gateway, f"http://127.0.0.1:{port}/health", timeout=60)
                results[label] = [load_run(f"http://127.0.0.1:{port}", urls, requests_total=args.requests,
                                           clients=args.clients, max_tokens=max_tokens)
                                  for max_tokens in args.max_tokens]
            finally:
                gateway.stop()
    finally:
        for proc in reversed(procs):
            proc.stop()
    weighted = results["weighted_3_1"]
    goals = {}
    for entry in weighted:
        goals[f"max_tokens={entry['max_tokens']}: held_ratio within 10% of 3"] = abs(entry["held_ratio"] - 3) <= 0.3
        goals[f"max_tokens={entry['max_tokens']}: heavy_share within 10% of 0.75"] = \
            abs(entry["heavy_share"] - 0.75) <= 0.075
    return {"benchmark": "weighted_routing", "model": args.model, "clients": args.clients,
            "requests": args.requests, "weights": list(WEIGHTS), **results, "goals": goals,
            "environment": environment()}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
