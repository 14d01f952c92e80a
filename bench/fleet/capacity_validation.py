"""Is the capacity planner right on this machine? Profile real workers, plan, run the plan, measure.

1. Profile: start the layout's workers (tiny model by default; `--model smollm2`), drive them at the profiler's load
   levels (controlplane/capacity/load_driver.py, as `tandem_profile` does) and fit the curves.
2. Plan: objectives from the idle times (TTFT P99 ≤ 4 × a lone prefill + KV push, ITL P99 ≤ 3 × (a lone decode
   step + the per-request overhead, + a lone prefill on a colocated worker, whose decode gaps may span one)),
   then the rate one replica per pool carries within them (the planner's headroom search), and a plan for 60% of
   it: the plan must size each pool at one replica (a 2-core machine runs no more), and predicts P99s there.
3. Validate at the planned load: the planned workers behind a real gateway, Poisson arrivals through
   /v1/completions (SSE), TTFT and ITL measured as the client sees them. Goal: the objectives are met, as predicted.
4. Validate throughput: the same workers driven at 8 × the capacity (saturated), completed requests/s against the
   simulation's at that rate. Goal: within 20%.

JSON out (the baseline, the prediction, is computed in the same run from the same machine's profile).

    python bench/fleet/capacity_validation.py [--model tiny|smollm2] [--layout disaggregated|colocated] [--quick]
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import bootstrap, emit, environment, model_dir  # noqa: E402

THROUGHPUT_GOAL = 0.20


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    p.add_argument("--layout", default="disaggregated", choices=("disaggregated", "colocated"))
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=24)
    p.add_argument("--requests", type=int, default=80, help="requests per validation phase")
    p.add_argument("--quick", action="store_true", help="quick profile levels")
    return p.parse_args(argv)


def start_workers(layout: str, model: Path, log_dir: Path):
    from tests.procs import free_port, start, wait_http

    roles = ("prefill", "decode") if layout == "disaggregated" else ("colocated",)
    procs, urls = [], {}
    for role in roles:
        port = free_port()
        proc = start(f"{role}-{port}", ["-m", "inference.worker", "--role", role, "--model", str(model), "--port",
                                        str(port), "--threads", "1", "--dtype", "float32", "--kv-cache-bytes", "256M"],
                     log_dir, env={"OMP_NUM_THREADS": "1"})
        procs.append(proc)
        urls[role] = f"http://127.0.0.1:{port}"
    for proc, url in zip(procs, urls.values()):
        wait_http(proc, f"{url}/health", timeout=300)
    return procs, urls


def start_gateway(urls: dict, log_dir: Path):
    from tests.procs import free_port, start, wait_http

    port = free_port()
    flags = []
    for role, url in urls.items():
        flags += [f"--{role}", url]
    # A saturated phase queues requests for minutes on a slow model: the gateway must not give up on them.
    proc = start(f"gateway-{port}", ["-m", "inference.gateway", "--port", str(port), "--served-model-name", "bench",
                                     "--request-timeout", "1800", *flags], log_dir)
    wait_http(proc, f"http://127.0.0.1:{port}/health", timeout=120)
    return proc, f"http://127.0.0.1:{port}"


def profile(layout: str, urls: dict, quick: bool) -> dict:
    """{"prefill", "decode"} (or {"colocated"}) StageModels measured on the running workers."""
    import requests

    from controlplane.capacity.load_driver import Levels, drive
    from controlplane.capacity.sizing.calibration import kv_seconds_per_token, model_from_points

    serving = urls.get("colocated") or urls["prefill"]
    decode_url = urls.get("decode")
    info = requests.get(f"{decode_url or serving}/info", timeout=10).json()
    levels = Levels.for_run(quick=quick, max_model_len=info["max_model_len"], max_num_seqs=info["max_num_seqs"])
    points = drive(serving_url=serving, decode_url=decode_url, levels=levels,
                   progress=lambda f, s: print(f"profile {f:4.0%} {s}", file=sys.stderr))
    # The KV push of a lone request: under concurrency the figure includes waiting for the busy decode worker,
    # which the simulation models as decode queueing already.
    model = model_from_points(points, layout="colocated" if decode_url is None else "disaggregated",
                              max_num_seqs=info["max_num_seqs"], max_batch_tokens=info["max_num_batched_tokens"],
                              kv_capacity_tokens=info["num_kv_blocks"] * info["kv_layout"]["block_size"])
    return {"model": model, "kv_s_per_token": kv_seconds_per_token(points), "points": points}


async def drive_load(gateway_url: str, *, rate: float, num_requests: int, prompt_tokens: int, output_tokens: int,
                     seed: int) -> dict:
    """Poisson arrivals of streamed completions; TTFT and inter-token gaps as the client sees them."""
    import aiohttp

    from controlplane.capacity.load_driver import prompt_of

    rng = random.Random(seed)
    ttfts, gaps, spans, errors = [], [], [], []
    started = time.perf_counter()

    async def one(session, delay: float) -> None:
        await asyncio.sleep(delay)
        t0 = time.perf_counter()
        arrival = t0 - started
        body = {"model": "bench", "prompt": prompt_of(prompt_tokens), "max_tokens": output_tokens,
                "temperature": 0, "ignore_eos": True, "stream": True}
        last = None
        async with session.post(f"{gateway_url}/v1/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=1800)) as response:
            if response.status != 200:
                errors.append(f"HTTP {response.status}: {(await response.text())[:200]}")
                return
            async for line in response.content:
                line = line.strip()
                if not line.startswith(b"data: {"):
                    continue
                now = time.perf_counter()
                if last is None:
                    ttfts.append(now - t0)
                else:
                    gaps.append(now - last)
                last = now
        spans.append((arrival, time.perf_counter() - started))

    delays, t = [], 0.0
    for _ in range(num_requests):
        t += rng.expovariate(rate)
        delays.append(t)
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, d) for d in delays))
    # As the simulation counts: the requests after the first 10% (by arrival), over the time from the first of
    # them arriving to the last of them finishing.
    counted = sorted(spans)[num_requests // 10:]
    span = max(end for _, end in counted) - counted[0][0]
    return {"ttft_p99_s": quantile(ttfts, 0.99), "itl_p99_s": quantile(gaps, 0.99),
            "ttft_p50_s": quantile(ttfts, 0.5), "itl_p50_s": quantile(gaps, 0.5),
            "throughput_rps": len(counted) / span if span > 0 else None, "offered_rps": rate,
            "num_errors": len(errors), "first_error": errors[0] if errors else None}


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main(argv=None) -> dict:
    import signal

    args = parse_args(argv)
    bootstrap()
    # A SIGTERM unwinds like Ctrl-C, so that the workers and the gateway this run started are stopped.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    from dataclasses import replace

    from controlplane.capacity.sizing.search import Objectives, Prices, capacity_rps, plan_layout
    from controlplane.capacity.sizing.simulation import Traffic, simulate

    model_path = model_dir(args.model)
    log_dir = Path(tempfile.mkdtemp(prefix="tandem-capacity-"))
    layout = args.layout
    procs, urls = start_workers(layout, model_path, log_dir)
    gateway = None
    try:
        measured = profile(layout, urls, args.quick)
        base = measured["model"]
        model = replace(base, kv_transfer_s=measured["kv_s_per_token"] * args.prompt_tokens)
        models = {"prefill": model, "decode": model, "colocated": model}
        lone_prefill = model.prefill.step_seconds(args.prompt_tokens)
        lone_step = model.decode.step_seconds(1, args.prompt_tokens + args.output_tokens) + model.request_overhead_s
        # On a colocated worker a decode gap may span a prefill step: its ITL objective allows one.
        objectives = Objectives(ttft_p99_s=4 * (lone_prefill + model.kv_transfer_s),
                                itl_p99_s=3 * (lone_step + (lone_prefill if layout == "colocated" else 0.0)))
        shape = Traffic(1.0, args.prompt_tokens, args.output_tokens, 0.0, 0.0)

        def run_one(t: Traffic):
            return simulate(model, t, layout=layout, prefill_replicas=1, decode_replicas=1, num_requests=400)

        capacity = capacity_rps(run_one, shape, objectives)
        print(f"profile: {model}; objectives {objectives}; capacity {capacity:.3g} requests/s", file=sys.stderr)
        if capacity <= 0:
            raise SystemExit("the objectives are not met at any rate by one replica per pool: see the profile above")
        traffic = shape.scaled(rate=0.6 * capacity)
        planned = plan_layout(layout, models=models, traffic=traffic, objectives=objectives, prices=Prices(),
                              num_requests=400)
        gateway, gateway_url = start_gateway(urls, log_dir)
        at_plan = asyncio.run(drive_load(gateway_url, rate=traffic.requests_per_s, num_requests=args.requests,
                                         prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens, seed=1))
        # Far past capacity, so that both the simulation and the workers run flat out: throughput is then what the
        # replicas can do, not what was offered. The same number of requests on both sides.
        overload = shape.scaled(rate=8 * capacity)
        predicted_saturated = simulate(model, overload, layout=layout, prefill_replicas=1, decode_replicas=1,
                                       num_requests=args.requests, seed=2)
        saturated = asyncio.run(drive_load(gateway_url, rate=overload.requests_per_s, num_requests=args.requests,
                                           prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                                           seed=2))
    finally:
        for proc in ([gateway] if gateway else []) + procs:
            proc.stop()
    predicted_objectives_met = planned.feasible
    measured_met = (at_plan["ttft_p99_s"] <= objectives.ttft_p99_s and at_plan["itl_p99_s"] <= objectives.itl_p99_s)
    error = abs(saturated["throughput_rps"] / predicted_saturated.throughput_rps - 1.0)
    doc = {
        "bench": "capacity_validation", "model": args.model, "layout": layout, "environment": environment(),
        "profile": {"prefill": model.prefill.as_dict(), "decode": model.decode.as_dict(),
                    "kv_transfer_s": model.kv_transfer_s, "request_overhead_s": model.request_overhead_s,
                    "saturation_burst": measured["points"].get("saturation"), "num_points": {k: len(v) for k, v in
                                                                         measured["points"].items()}},
        "objectives": {"ttft_p99_s": objectives.ttft_p99_s, "itl_p99_s": objectives.itl_p99_s},
        "capacity_rps_one_replica_per_pool": capacity,
        "plan": planned.as_dict(),
        "at_planned_load": {"offered_rps": traffic.requests_per_s, "predicted": planned.predicted,
                            "measured": at_plan},
        "saturated": {"offered_rps": overload.requests_per_s,
                      "predicted_throughput_rps": predicted_saturated.throughput_rps,
                      "measured_throughput_rps": saturated["throughput_rps"], "error": round(error, 3)},
        "goals": {
            "throughput_within_20pct": error <= THROUGHPUT_GOAL,
            "plan_is_one_replica_per_pool": all(n == 1 for n in planned.replicas.values()),
            "objectives_met_when_predicted": (not predicted_objectives_met) or measured_met,
        },
    }
    emit(doc)
    return doc


if __name__ == "__main__":
    main()
