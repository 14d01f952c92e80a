"""A quiet tenant beside a flood, past its first token: the ITL objective bounding the decode batch, measured.

One real colocated worker (float32, 1 thread, --max-num-seqs --slots) behind a real gateway and a stand-in control
plane with two tenants (keys required): `noisy` keeps --flood-factor x the slots in long streams (closed loop), `quiet`
sends one short streamed request every --quiet-interval s. For each objective in --objectives (`none`: the membership
carries none, as before; else seconds, the deployment's `itl_p99_seconds`), in the same run on the same worker:

1. quiet alone: its TTFT and inter-token gaps;
2. the flood alone: completion tokens/s;
3. the flood and quiet together: quiet's TTFT and gaps P50/P99, the total tokens/s, the worker's batch limit and
   running sequences, and quiet's share of the gateway's running requests while one of its requests waits in the
   admission queue, against its fair share (max-min over the two tenants' demand).

Then the goals of the isolation issue: quiet TTFT P99 <= TTFT alone (P99) + one decode step of the batch it joins (the
worker's fitted step at the mean running batch, /info `decode_step`), quiet gap P99 <= the objective, quiet's share
while waiting >= 0.9 of its fair share, total tokens/s >= 0.9x the flood alone.

    python bench/gateway/itl_isolation.py --model tiny --objectives none,0.02
    python bench/gateway/itl_isolation.py --model smollm2 --slots 32 --objectives none,0.1
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.gateway.tenant_load import KEYS, pct  # noqa: E402
from bench.lib.common import emit, environment, model_dir  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    p.add_argument("--slots", type=int, default=16, help="the worker's --max-num-seqs")
    p.add_argument("--flood-factor", type=int, default=4, help="noisy's streams in flight, per slot")
    p.add_argument("--long-tokens", type=int, default=256)
    p.add_argument("--short-tokens", type=int, default=16)
    p.add_argument("--quiet-interval", type=float, default=0.5)
    p.add_argument("--duration", type=float, default=20.0, help="seconds measured per loaded phase")
    p.add_argument("--objectives", default="none,0.02", help="comma-separated: none or seconds")
    p.add_argument("--worker-args", default="", help="more worker flags, e.g. --no-interleave-prefill")
    p.add_argument("--pin", action="store_true",
                   help="the worker on the second CPU, the gateway, the stand-in control plane and this client on "
                        "the first: the load generator out of the worker's way")
    return p.parse_args(argv)


class Client:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session, self.url = session, url
        self.tokens = 0
        self.failures: dict[str, int] = {}

    async def stream(self, tenant: str, max_tokens: int) -> tuple[float, list[float]] | None:
        """(TTFT, the gaps between its token chunks) of one streamed request, or None when it failed."""
        body = {"model": "demo", "prompt": "one two three four", "max_tokens": max_tokens, "stream": True,
                "ignore_eos": True}
        started = time.monotonic()
        times = []
        async with self.session.post(self.url + "/v1/completions", json=body,
                                     headers={"Authorization": f"Bearer {KEYS[tenant]}"}) as resp:
            if resp.status != 200:
                await resp.read()
                key = f"{tenant}:{resp.status}"
                self.failures[key] = self.failures.get(key, 0) + 1
                return None
            async for line in resp.content:
                if line.startswith(b"data: {") and json.loads(line[6:]).get("choices"):
                    times.append(time.monotonic())
                    self.tokens += 1
        if not times:
            return None
        return times[0] - started, [b - a for a, b in zip(times, times[1:])]

    async def flood(self, num: int, max_tokens: int, until: float) -> None:
        async def one() -> None:
            while time.monotonic() < until:
                await self.stream("noisy", max_tokens)
        await asyncio.gather(*(one() for _ in range(num)))

    async def quiet(self, max_tokens: int, interval: float, until: float, out: list) -> None:
        pending = []
        while time.monotonic() < until:
            pending.append(asyncio.create_task(self.stream("quiet", max_tokens)))
            await asyncio.sleep(interval)
        out.extend(r for r in await asyncio.gather(*pending) if r is not None)


async def worker_gaps(session, worker: str) -> dict[str, float]:
    """The worker's inter-token latency histogram: upper bound (text) → cumulative count, summed over labels."""
    async with session.get(worker + "/metrics") as r:
        text = await r.text()
    buckets: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("tandem_inter_token_latency_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[le] = buckets.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
    return buckets


def within(before: dict, after: dict, objective: float | None) -> dict | None:
    """The share of the worker's gaps in the phase that were at most the histogram bound nearest at or above the
    objective (its buckets are fixed: ITL_BUCKETS), and that bound."""
    total = after.get("+Inf", 0) - before.get("+Inf", 0)
    bounds = sorted(float(le) for le in after if le != "+Inf" and (objective is None or float(le) >= objective))
    if not total or not bounds or objective is None:
        return None
    le = next(text for text in after if text != "+Inf" and float(text) == bounds[0])
    return {"bound_s": bounds[0], "share": round((after[le] - before.get(le, 0)) / total, 4)}


def _gauges(text: str) -> dict[tuple[str, str], float]:
    """(metric, tenant) → value of the gateway's per-tenant running and queued gauges."""
    found: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        for name in ("tandem_gateway_tenant_requests_running", "tandem_gateway_queue_length"):
            if line.startswith(name + "{"):
                tenant = line.split('tenant="', 1)[1].split('"', 1)[0]
                found[(name, tenant)] = found.get((name, tenant), 0.0) + float(line.rsplit(" ", 1)[1])
    return found


async def sample(session, gateway: str, worker: str, until: float, out: dict) -> None:
    """Every 50 ms: quiet's share of the requests holding slots while one of its requests queues, against its fair
    share, and the worker's running sequences and batch limit."""
    while time.monotonic() < until:
        async with session.get(gateway + "/metrics") as r:
            gauges = _gauges(await r.text())
        async with session.get(worker + "/info") as r:
            info = await r.json()
        out["batch_limit"].append(info.get("batch_limit"))
        queued = {t: gauges.get(("tandem_gateway_queue_length", t), 0) for t in KEYS}
        holding = {t: gauges.get(("tandem_gateway_tenant_requests_running", t), 0) - queued[t] for t in KEYS}
        out["holding"].append(sum(holding.values()))
        if queued["quiet"] > 0:
            slots = sum(holding.values())
            demand = holding["quiet"] + queued["quiet"]
            fair = min(demand, slots / 2)
            out["share_vs_fair"].append(holding["quiet"] / fair if fair else 1.0)
        await asyncio.sleep(0.05)


async def measure(gateway: str, worker: str, args, objective: float | None) -> dict:
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        client = Client(session, gateway)
        alone = [r for r in [await client.stream("quiet", args.short_tokens) for _ in range(10)] if r]
        client.tokens = 0
        started = time.monotonic()
        await client.flood(args.flood_factor * args.slots, args.long_tokens, started + args.duration)
        flood_tps = client.tokens / (time.monotonic() - started)
        client.tokens, client.failures = 0, {}
        loaded: list = []
        samples = {"batch_limit": [], "holding": [], "share_vs_fair": []}
        gaps_before = await worker_gaps(session, worker)
        started = time.monotonic()
        until = started + args.duration
        await asyncio.gather(client.flood(args.flood_factor * args.slots, args.long_tokens, until),
                             client.quiet(args.short_tokens, args.quiet_interval, until, loaded),
                             sample(session, gateway, worker, until, samples))
        total_tps = client.tokens / (time.monotonic() - started)
        gaps_after = await worker_gaps(session, worker)
        async with session.get(worker + "/info") as r:
            step = (await r.json()).get("decode_step")
    gaps = [g for _, gs in loaded for g in gs]
    limits = [n for n in samples["batch_limit"] if n]
    mean_batch = min(args.slots, sum(limits) / len(limits)) if limits else args.slots
    step_s = step["fixed_s"] + step["per_sequence_s"] * mean_batch if step else None
    return {"alone": {"ttft_p50_s": pct([t for t, _ in alone], 0.5), "ttft_p99_s": pct([t for t, _ in alone], 0.99),
                      "gap_p99_s": pct([g for _, gs in alone for g in gs], 0.99)},
            "flood_alone_tokens_per_s": round(flood_tps, 1),
            "loaded": {"quiet_requests": len(loaded), "failures": client.failures,
                       "quiet_ttft_p50_s": pct([t for t, _ in loaded], 0.5),
                       "quiet_ttft_p99_s": pct([t for t, _ in loaded], 0.99),
                       "quiet_gap_p50_s": pct(gaps, 0.5), "quiet_gap_p99_s": pct(gaps, 0.99),
                       "quiet_gaps_within_objective": (round(sum(g <= objective for g in gaps) / len(gaps), 4)
                                                       if gaps and objective else None),
                       # every stream's gaps as the worker saw them, against the bucket bound at or above it
                       "worker_gaps_within_objective": within(gaps_before, gaps_after, objective),
                       "total_tokens_per_s": round(total_tps, 1),
                       "batch_limit_mean": round(sum(limits) / len(limits), 1) if limits else None,
                       "slots_held_mean": round(sum(samples["holding"]) / max(1, len(samples["holding"])), 1),
                       "quiet_waiting_samples": len(samples["share_vs_fair"]),
                       "quiet_share_vs_fair_min": (round(min(samples["share_vs_fair"]), 2)
                                                   if samples["share_vs_fair"] else None),
                       "quiet_share_vs_fair_mean": (round(sum(samples["share_vs_fair"])
                                                          / len(samples["share_vs_fair"]), 2)
                                                    if samples["share_vs_fair"] else None)},
            "decode_step": step, "step_of_the_batch_s": round(step_s, 4) if step_s else None}


def goals(result: dict, objective: float | None) -> dict:
    alone, loaded = result["alone"], result["loaded"]
    found = {"total tokens/s >= 0.9x the flood alone":
             loaded["total_tokens_per_s"] >= 0.9 * result["flood_alone_tokens_per_s"]}
    if result["step_of_the_batch_s"] and loaded["quiet_ttft_p99_s"] is not None:
        found["quiet TTFT P99 <= alone + one decode step"] = (
            loaded["quiet_ttft_p99_s"] <= alone["ttft_p99_s"] + result["step_of_the_batch_s"])
    if objective is not None and loaded["quiet_gap_p99_s"] is not None:
        found["quiet ITL P99 <= the objective"] = loaded["quiet_gap_p99_s"] <= objective
    if loaded["quiet_share_vs_fair_mean"] is not None:
        found["quiet share while waiting >= 0.9 fair (mean of 50 ms samples)"] = (
            loaded["quiet_share_vs_fair_mean"] >= 0.9)
    return found


def _pin_this_process(cpu: int) -> None:
    """Every thread of this process (the stand-in control plane's included) on `cpu`."""
    for task in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(task), {cpu})


def run(args) -> dict:
    from tests.inference.gateway.support import TOKEN, ControlPlane
    from tests.procs import free_port, start, wait_http

    log_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-itl-"))
    port, gw_port = free_port(), free_port()
    worker_url, gateway_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{gw_port}"
    control_plane = ControlPlane()
    tenants = {name: {"class": "standard", "limits": {}, "allowed": True,
                      "keys": [{"hash": hashlib.sha256(key.encode()).hexdigest(), "expires_at": None}]}
               for name, key in KEYS.items()}
    control_plane.endpoints.update({"groups": [{"revision": 1, "colocated": [worker_url]}], "requires_key": True,
                                    "tenants": tenants})
    control_plane.start()
    procs = []
    results = {}
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin and len(cpus) < 2:
        raise SystemExit("--pin needs two CPUs")
    try:
        if args.pin:  # children inherit the affinity they are started with
            _pin_this_process(cpus[1])
        procs.append(start("worker", ["-m", "inference.worker", "--role", "colocated", "--model",
                                      str(model_dir(args.model)), "--dtype", "float32", "--threads", "1",
                                      "--kv-cache-bytes", "512M", "--port", str(port),
                                      "--max-num-seqs", str(args.slots), *args.worker_args.split()], log_dir))
        if args.pin:
            _pin_this_process(cpus[0])
        wait_http(procs[-1], worker_url + "/health", timeout=300)
        procs.append(start("gateway", ["-m", "inference.gateway", "--port", str(gw_port), "--control-plane",
                                       control_plane.url, "--deployment", "demo", "--token", TOKEN], log_dir))
        wait_http(procs[-1], gateway_url + "/health", timeout=60)
        for text in args.objectives.split(","):
            objective = None if text == "none" else float(text)
            control_plane.endpoints["objectives"] = {"itl_p99_seconds": objective}
            control_plane.wait_polls(2)
            result = asyncio.run(measure(gateway_url, worker_url, args, objective))
            result["goals"] = goals(result, objective)
            results[text] = result
    finally:
        for proc in reversed(procs):
            proc.stop()
        control_plane.stop()
    info = {"model": args.model, "dtype": "float32", "threads": 1, "slots": args.slots,
            "more_args": args.worker_args,
            "pinned": f"worker on CPU {cpus[1]}, the rest on CPU {cpus[0]}" if args.pin else None}
    return {"benchmark": "itl_isolation", "worker": info, "flood_streams": args.flood_factor * args.slots,
            "long_tokens": args.long_tokens, "short_tokens": args.short_tokens,
            "quiet_interval_s": args.quiet_interval, "duration_s": args.duration, "objectives": results,
            "environment": environment()}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
