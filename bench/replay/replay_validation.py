"""Is the replay right on this machine? A trace served by real workers, then replayed in the simulation.

For each layout (1 prefill + 1 decode, 1 prefill + 2 decode, 2 colocated):
1. Start the layout's workers (tiny model by default; `--model smollm2`) behind a real gateway, and profile one
   worker of each role (controlplane/capacity/load_driver.py, as `tandem_profile` does) into stage models.
2. Serve a trace in real time: a bounded open-loop load generator sends streamed completions at the trace's
   arrival times (a base rate with a burst in the middle, prompt and output lengths that vary), measuring TTFT and
   inter-token gaps as the client sees them.
3. Read the gateway's own record of it (GET /trace: what the control plane stores as the recorded trace) and replay
   that record in the simulation (controlplane/replay/sim) with the profiled stage models and the same layout.
4. Compare: TTFT and ITL P50/P99 (goal: within 20 %) and goodput (requests meeting the objectives per second; goal:
   within 10 %), the objectives derived from the idle step times as bench/fleet/capacity_validation.py does.

JSON out; the prediction and the measurement come from the same run on the same machine.

    python bench/replay/replay_validation.py [--model tiny|smollm2] [--minutes 10] [--layouts 1+1,1+2,2c]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import bootstrap, emit, environment, model_dir  # noqa: E402

LAYOUTS = {"1+1": ("disaggregated", 1, 1), "1+2": ("disaggregated", 1, 2), "2c": ("colocated", 0, 2)}
LATENCY_GOAL, GOODPUT_GOAL = 0.20, 0.10
MAX_IN_FLIGHT = 256  # the load generator's bound: beyond it the client itself would be the bottleneck


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    p.add_argument("--minutes", type=float, default=10.0, help="trace length per layout")
    p.add_argument("--layouts", default="1+1,1+2,2c")
    p.add_argument("--load", type=float, default=0.6, help="base rate as a share of one pool's profiled capacity")
    p.add_argument("--max-rate", type=float, default=6.0,
                   help="requests/s at most: the client, the gateway and the workers share this machine's cores")
    p.add_argument("--quick", action="store_true", help="quick profile levels")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def start_layout(mode: str, prefill: int, decode: int, model: Path, log_dir: Path):
    from tests.procs import free_port, start, wait_http

    roles = ["prefill"] * prefill + ["decode"] * decode if mode == "disaggregated" else ["colocated"] * decode
    procs, urls = [], []
    for role in roles:
        port = free_port()
        procs.append(start(f"{role}-{port}", ["-m", "inference.worker", "--role", role, "--model", str(model),
                                              "--port", str(port), "--threads", "1", "--dtype", "float32",
                                              "--kv-cache-bytes", "256M"], log_dir, env={"OMP_NUM_THREADS": "1"}))
        urls.append((role, f"http://127.0.0.1:{port}"))
    for proc, (_, url) in zip(procs, urls):
        wait_http(proc, f"{url}/health", timeout=300)
    by_role: dict[str, list[str]] = {}
    for role, url in urls:
        by_role.setdefault(role, []).append(url)
    port = free_port()
    flags = [arg for role, role_urls in by_role.items() for arg in (f"--{role}", ",".join(role_urls))]
    gateway = start(f"gateway-{port}", ["-m", "inference.gateway", "--port", str(port), "--served-model-name",
                                        "bench", "--request-timeout", "1800", *flags], log_dir)
    wait_http(gateway, f"http://127.0.0.1:{port}/health", timeout=120)
    return [gateway, *procs], by_role, f"http://127.0.0.1:{port}"


def make_trace(minutes: float, rate: float, seed: int) -> list[tuple[float, int, int]]:
    """(arrival s, prompt tokens, output tokens): the base rate, doubled over the middle fifth of the trace."""
    rng = random.Random(seed)
    end, t, out = minutes * 60.0, 0.0, []
    while True:
        burst = 0.4 * end <= t < 0.6 * end
        t += rng.expovariate(rate * (2.0 if burst else 1.0))
        if t >= end:
            return out
        out.append((t, max(8, min(400, round(rng.lognormvariate(4.0, 0.6)))),
                    max(2, min(128, round(rng.lognormvariate(3.0, 0.7))))))


async def serve(gateway_url: str, trace: list[tuple[float, int, int]]) -> dict:
    """Send the trace in real time; per request: arrival, TTFT, gaps, end (client side)."""
    import aiohttp

    from controlplane.capacity.load_driver import prompt_of

    gate = asyncio.Semaphore(MAX_IN_FLIGHT)
    results, started = [], time.perf_counter()

    async def one(session, index: int, at: float, prompt: int, output: int) -> None:
        await asyncio.sleep(max(0.0, at - (time.perf_counter() - started)))
        async with gate:
            t0, last, gaps, first = time.perf_counter(), None, [], None
            # A distinct head per request: the gateway's prefix hashes see distinct prompts, as the workers do.
            body = {"model": "bench", "prompt": f"request {index}: " + prompt_of(prompt), "max_tokens": output,
                    "temperature": 0, "ignore_eos": True, "stream": True}
            async with session.post(f"{gateway_url}/v1/completions", json=body,
                                    timeout=aiohttp.ClientTimeout(total=1800)) as response:
                if response.status != 200:
                    results.append({"status": response.status})
                    return
                async for line in response.content:
                    if not line.strip().startswith(b"data: {"):
                        continue
                    now = time.perf_counter()
                    if last is None:
                        first = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
            results.append({"status": 200, "ttft": first, "gaps": gaps, "e2e": time.perf_counter() - t0})

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(one(session, i, *item) for i, item in enumerate(trace)))
    return {"results": results, "wall_s": time.perf_counter() - started}


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def measured_figures(results: list[dict], objectives, span_s: float) -> dict:
    ok = [r for r in results if r.get("status") == 200 and r.get("ttft") is not None]
    gaps = [g for r in ok for g in r["gaps"]]
    good = [r for r in ok if r["ttft"] <= objectives.ttft_s
            and (not r["gaps"] or sum(r["gaps"]) / len(r["gaps"]) <= objectives.itl_s)]
    return {"requests": len(results), "served": len(ok),
            "ttft_p50_s": quantile([r["ttft"] for r in ok], 0.5), "ttft_p99_s": quantile([r["ttft"] for r in ok], 0.99),
            "itl_p50_s": quantile(gaps, 0.5), "itl_p99_s": quantile(gaps, 0.99),
            "goodput_rps": len(good) / span_s}


def run_layout(name: str, args, model_path: Path) -> dict:
    import requests

    from bench.fleet.capacity_validation import profile
    from controlplane.replay.sim import Admission, Layout, Objectives, ReplayRequest, replay
    from inference.gateway.admission import DEFAULT_HEADROOM, DEFAULT_MAX_QUEUED

    mode, prefill, decode = LAYOUTS[name]
    log_dir = Path(tempfile.mkdtemp(prefix=f"tandem-replay-{name}-"))
    procs, urls, gateway_url = start_layout(mode, prefill, decode, model_path, log_dir)
    try:
        one = {"colocated": urls["colocated"][0]} if mode == "colocated" else \
            {"prefill": urls["prefill"][0], "decode": urls["decode"][0]}
        measured = profile(mode, one, args.quick)
        base = measured["model"]
        lone_prefill = base.prefill.step_seconds(64)
        lone_step = base.decode.step_seconds(1, 96) + base.request_overhead_s
        objectives = Objectives(ttft_s=4 * lone_prefill + 0.05,
                                itl_s=3 * (lone_step + (lone_prefill if mode == "colocated" else 0.0)))
        # One pool's rate at the mean request (the decode pool's step at a full batch over its tokens).
        per_replica = base.max_num_seqs / (base.decode.step_seconds(base.max_num_seqs, 96) * 20)
        rate = min(args.load * per_replica * decode, args.max_rate)
        trace = make_trace(args.minutes, rate, args.seed)
        served = asyncio.run(serve(gateway_url, trace))
        records, after = [], 0
        while True:
            page = requests.get(f"{gateway_url}/trace", params={"after": after}, timeout=30).json()
            records += page["records"]
            if not page["records"] or records[-1]["seq"] >= page["last"]:
                break
            after = records[-1]["seq"]
    finally:
        for proc in procs:
            proc.stop()
    records = [r for r in records if r["t"] >= 0]
    first = min(r["t"] for r in records)
    replayed = [ReplayRequest(arrival_s=r["t"] - first, prompt_tokens=r["prompt_tokens"],
                              output_tokens=max(1, r["completion_tokens"] or r["max_tokens"] or 1),
                              tenant=r["tenant"], block_tokens=max(1, r["block_tokens"] or 16)) for r in records]
    kv = measured["kv_s_per_token"] * sum(r.prompt_tokens for r in replayed) / len(replayed)
    stage = replace(base, kv_transfer_s=kv)
    models = {"colocated": stage} if mode == "colocated" else {"prefill": stage, "decode": stage}
    started = time.perf_counter()
    result = replay(replayed, models=models, layout=Layout(mode, prefill, decode),
                    admission=Admission(queue_size=DEFAULT_MAX_QUEUED, queue_timeout_s=30.0,
                                        headroom=DEFAULT_HEADROOM), objectives=objectives)
    sim_wall = time.perf_counter() - started
    span = max(r["t"] + r["e2e_s"] for r in records) - first
    real = measured_figures(served["results"], objectives, span)
    sim = {"requests": result.offered, "served": result.served, "ttft_p50_s": result.ttft_s["p50"],
           "ttft_p99_s": result.ttft_s["p99"], "itl_p50_s": result.itl_s["p50"], "itl_p99_s": result.itl_s["p99"],
           "goodput_rps": result.goodput_rps}
    errors = {key: (sim[key] / real[key] - 1.0) if real[key] else None
              for key in ("ttft_p50_s", "ttft_p99_s", "itl_p50_s", "itl_p99_s", "goodput_rps")}
    return {"layout": name, "offered_rps": rate, "trace_requests": len(trace), "objectives":
            {"ttft_s": objectives.ttft_s, "itl_s": objectives.itl_s},
            "profile": {"prefill": base.prefill.as_dict(), "decode": base.decode.as_dict(), "kv_transfer_s": kv,
                        "request_overhead_s": base.request_overhead_s, "max_num_seqs": base.max_num_seqs},
            "measured": real, "simulated": sim, "simulation_wall_s": sim_wall,
            "relative_error": errors,
            "goals": {"latency_within_20pct": all(e is not None and abs(e) <= LATENCY_GOAL
                                                  for k, e in errors.items() if k != "goodput_rps"),
                      "goodput_within_10pct": errors["goodput_rps"] is not None
                      and abs(errors["goodput_rps"]) <= GOODPUT_GOAL}}


def main(argv=None) -> dict:
    import signal

    args = parse_args(argv)
    bootstrap()
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    model_path = model_dir(args.model)
    layouts = [name.strip() for name in args.layouts.split(",") if name.strip()]
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown:
        raise SystemExit(f"unknown layout {unknown[0]!r}: give some of {', '.join(LAYOUTS)}")
    doc = {"bench": "replay_validation", "model": args.model, "minutes": args.minutes, "environment": environment(),
           "layouts": [run_layout(name, args, model_path) for name in layouts]}
    emit(doc)
    return doc


if __name__ == "__main__":
    main()
