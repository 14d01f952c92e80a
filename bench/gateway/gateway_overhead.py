"""Latency the gateway adds: the same max_tokens=1 request sent to a colocated worker directly and through
`python -m inference.gateway` in front of it (real processes, free ports, keep-alive HTTP on both paths).

Requests alternate direct / gateway so that load drift on a shared machine hits both alike. The figure is
P50(gateway) - P50(direct) (goal <= 2 ms); the P50 of the paired differences is reported too.

    python bench/gateway/gateway_overhead.py --requests 200
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
from bench.lib.common import bootstrap, emit, environment, model_dir  # noqa: E402

GOAL_MS = 2.0
PROMPT = "The quick brown fox jumps over the lazy dog."
SERVED_NAME = "bench"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    p.add_argument("--requests", type=int, default=100, help="timed requests per path")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--stream", action="store_true", help="stream through the gateway (SSE) instead of JSON")
    return p.parse_args(argv)


def direct_request(session, worker_url: str, i: int) -> None:
    body = {"request_id": f"bench-direct-{i}", "prompt": PROMPT, "max_tokens": 1, "temperature": 0.0}
    with session.post(f"{worker_url}/v1/generate", json=body, stream=True, timeout=30) as r:
        r.raise_for_status()
        last = None
        for line in r.iter_lines():
            if line:
                last = json.loads(line)
        if not last or last.get("type") != "done":
            raise RuntimeError(f"worker stream ended without done: {last}")


def gateway_request(session, gateway_url: str, stream: bool) -> None:
    body = {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 1, "temperature": 0.0, "stream": stream}
    with session.post(f"{gateway_url}/v1/completions", json=body, stream=stream, timeout=30) as r:
        if r.status_code != 200:
            raise RuntimeError(f"gateway HTTP {r.status_code}: {r.text[:300]}")
        if stream:
            lines = [line for line in r.iter_lines() if line]
            if not lines or lines[-1] != b"data: [DONE]":
                raise RuntimeError(f"SSE stream did not end with [DONE]: {lines[-2:]}")
        elif not r.json()["choices"]:
            raise RuntimeError(f"no choices: {r.text[:300]}")


def wait_until_serving(session, gateway_url: str, deadline_s: float = 60.0) -> None:
    """The gateway learns of the worker by its health probe; a 503 until then is expected."""
    deadline = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < deadline:
        try:
            gateway_request(session, gateway_url, stream=False)
            return
        except Exception as exc:
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"gateway not serving after {deadline_s}s: {last}")


def run(args) -> dict:
    bootstrap()
    import requests

    from tests.procs import free_port, start, wait_http

    path = model_dir(args.model)
    log_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-gw-"))
    worker_port, gateway_port = free_port(), free_port()
    worker_url, gateway_url = f"http://127.0.0.1:{worker_port}", f"http://127.0.0.1:{gateway_port}"
    procs = []
    try:
        procs.append(start("colocated-worker", ["-m", "inference.worker", "--role", "colocated", "--model", str(path),
                                                "--port", str(worker_port), "--threads", "1"], log_dir))
        wait_http(procs[0], f"{worker_url}/health", timeout=120)
        procs.append(start("gateway", ["-m", "inference.gateway", "--port", str(gateway_port),
                                       "--colocated", worker_url, "--served-model-name", SERVED_NAME], log_dir))
        wait_http(procs[1], f"{gateway_url}/v1/models", timeout=60)
        direct, via = requests.Session(), requests.Session()
        wait_until_serving(via, gateway_url)
        for i in range(args.warmup):
            direct_request(direct, worker_url, -1 - i)
            gateway_request(via, gateway_url, args.stream)
        direct_ms, gateway_ms = [], []
        for i in range(args.requests):
            started = time.perf_counter()
            direct_request(direct, worker_url, i)
            direct_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            gateway_request(via, gateway_url, args.stream)
            gateway_ms.append((time.perf_counter() - started) * 1000)
    finally:
        for proc in reversed(procs):
            proc.stop()
    p50 = statistics.median
    added = p50(gateway_ms) - p50(direct_ms)
    paired = p50([g - d for g, d in zip(gateway_ms, direct_ms)])
    return {"benchmark": "gateway_overhead", "model": args.model, "requests": args.requests, "stream": args.stream,
            "direct_p50_ms": round(p50(direct_ms), 3), "gateway_p50_ms": round(p50(gateway_ms), 3),
            "direct_p90_ms": round(statistics.quantiles(direct_ms, n=10)[-1], 3),
            "gateway_p90_ms": round(statistics.quantiles(gateway_ms, n=10)[-1], 3),
            "added_p50_ms": round(added, 3), "paired_difference_p50_ms": round(paired, 3),
            "goals": {f"added_p50_ms<={GOAL_MS}": added <= GOAL_MS}, "environment": environment()}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
