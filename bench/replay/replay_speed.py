"""How fast the replay simulation runs an hour of trace on one core (goal: <= 30 s of wall time per hour).

The trace is synthesised, seeded, in the shape of the Azure LLM inference traces (code and conversation): bursty
arrivals (a base rate that jumps to a burst rate for spells of tens of seconds), heavy-tailed prompt and output
lengths (log-normal, capped), and block hashes where a share of the prompts begin with one of a few shared system
prompts, so the prefix cache has work to do. Replayed through 1 prefill + 2 decode and through 2 colocated workers,
with a stage model of the size a GPU worker of a small model shows.

    python bench/replay/replay_speed.py                 # one hour
    python bench/replay/replay_speed.py --hours 0.25 --rate 3
"""
from __future__ import annotations

import argparse
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import cpu_flags_of_interest, emit  # noqa: E402
from controlplane.capacity.sizing.curves import DecodeCurve, PrefillCurve  # noqa: E402
from controlplane.capacity.sizing.simulation import StageModel  # noqa: E402
from controlplane.replay.sim import Admission, Layout, Objectives, ReplayRequest, replay  # noqa: E402

GOAL_S_PER_HOUR = 30.0
BLOCK_TOKENS = 16
NUM_SYSTEM_PROMPTS = 8
SYSTEM_PROMPT_TOKENS = 512
SHARED_SHARE = 0.4  # of the requests that begin with a shared system prompt
MODEL = StageModel(prefill=PrefillCurve(0.015, 6e-5, 1e-9), decode=DecodeCurve(0.012, 1.5e-4, 2e-8),
                   max_num_seqs=64, max_batch_tokens=4096, kv_capacity_tokens=400_000, kv_transfer_s=0.005,
                   request_overhead_s=0.0005)


def lognormal(rng: random.Random, median: float, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(median * math.exp(rng.gauss(0.0, sigma)))))


def trace(hours: float, rate: float, seed: int) -> list[ReplayRequest]:
    """Arrivals at `rate` per second on average: a base of half of it, and bursts at three times it that come about
    once a minute and last tens of seconds."""
    rng = random.Random(seed)
    end, t, burst_until, requests = hours * 3600.0, 0.0, -1.0, []
    while True:
        if t >= burst_until and rng.random() < 0.02:
            burst_until = t + rng.uniform(10.0, 60.0)
        t += rng.expovariate(3 * rate if t < burst_until else 0.5 * rate)
        if t >= end:
            return requests
        prompt = lognormal(rng, 1200, 0.8, 16, 8000)
        output = lognormal(rng, 80, 1.0, 1, 2000)
        index = len(requests)
        num_blocks = prompt // BLOCK_TOKENS
        if rng.random() < SHARED_SHARE and prompt > SYSTEM_PROMPT_TOKENS:
            system = rng.randrange(NUM_SYSTEM_PROMPTS)
            shared = SYSTEM_PROMPT_TOKENS // BLOCK_TOKENS
            hashes = tuple(system * 10_000 + i for i in range(shared)) + \
                tuple((index + 1) * 100_000 + i for i in range(shared, num_blocks))
        else:
            hashes = tuple((index + 1) * 100_000 + i for i in range(num_blocks))
        requests.append(ReplayRequest(arrival_s=t, prompt_tokens=prompt, output_tokens=output,
                                      tenant=f"tenant-{rng.randrange(4)}", block_hashes=hashes,
                                      block_tokens=BLOCK_TOKENS))


def run(requests: list[ReplayRequest], layout: Layout, models: dict) -> dict:
    started = time.process_time()
    wall_started = time.perf_counter()
    # The gateway's defaults: a queue of 1,024, the standard class's deadline, max_num_seqs + 2 per streaming worker.
    result = replay(requests, models=models, layout=layout,
                    admission=Admission(queue_size=1024, queue_timeout_s=30.0, headroom=2),
                    objectives=Objectives(ttft_s=2.0, itl_s=0.1), prefix_cache_blocks=8192, routing="prefix")
    wall = time.perf_counter() - wall_started
    cpu = time.process_time() - started
    simulated = result.duration_s
    return {"layout": f"{layout.mode} {layout.prefill_replicas}+{layout.decode_replicas}",
            "requests": result.offered, "simulated_s": round(simulated, 1), "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2), "simulated_per_wall": round(simulated / wall, 1),
            "wall_s_per_hour": round(wall * 3600 / simulated, 2),
            "meets_goal": wall * 3600 / simulated <= GOAL_S_PER_HOUR,
            "served": result.served, "shed": result.shed, "slo_attainment": result.slo_attainment,
            "ttft_p99_s": result.ttft_s["p99"], "itl_p99_s": result.itl_s["p99"],
            "prefix_hit_rate": result.prefix_hit_rate, "utilisation": result.utilisation}


def cpu_model() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    for line in text.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=3.5, help="mean requests per second")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    requests = trace(args.hours, args.rate, args.seed)
    runs = [run(requests, Layout("disaggregated", 1, 2), {"prefill": MODEL, "decode": MODEL}),
            run(requests, Layout("colocated", 0, 2), {"colocated": MODEL})]
    emit({"benchmark": "replay_speed", "goal_wall_s_per_hour": GOAL_S_PER_HOUR, "hours": args.hours,
          "rate": args.rate, "seed": args.seed, "requests": len(requests),
          "prompt_tokens_mean": round(sum(r.prompt_tokens for r in requests) / len(requests), 1),
          "output_tokens_mean": round(sum(r.output_tokens for r in requests) / len(requests), 1),
          "runs": runs, "cpu_model": cpu_model(), "cpu_flags": cpu_flags_of_interest(),
          "cpu_count": os.cpu_count(), "load_avg": os.getloadavg()})


if __name__ == "__main__":
    main()
