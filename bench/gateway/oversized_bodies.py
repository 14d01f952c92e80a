"""Everyone else's throughput while a client floods the gateway with megabyte prompts that no worker could take.

One real colocated worker (the tiny model, float32, 1 thread) behind a real gateway. --clients closed-loop clients
stream --max-tokens tokens each; phases of --duration s: the clients alone, the clients beside an attacker that keeps
--attackers connections sending --body-mb MB prompts (refused by their Content-Length: longer than any prompt the
worker's context takes), and the clients alone again (the drift of a shared machine). Reported: the clients'
completion tokens/s per phase, the ratio of the attack phase to the mean of the two quiet ones (goal: >= 0.9), the
attacker's requests per second and answers, and the gateway's CPU seconds per phase.

    python bench/gateway/oversized_bodies.py
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import emit, environment, model_dir  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--attackers", type=int, default=4, help="connections sending oversized bodies at once")
    p.add_argument("--body-mb", type=float, default=1.0)
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--gateway-src", type=Path, default=None,
                   help="run the gateway from this checkout instead (e.g. `git archive REV | tar -x -C DIR`): the "
                        "gateway before a change, measured the same way")
    return p.parse_args(argv)


async def clients(url: str, args, until: float) -> int:
    """Completion tokens the clients got before `until`."""
    tokens = 0
    body = {"model": "tandem", "prompt": "one two three four", "max_tokens": args.max_tokens, "stream": True,
            "ignore_eos": True}

    async def one(session: aiohttp.ClientSession) -> None:
        nonlocal tokens
        while time.monotonic() < until:
            async with session.post(url + "/v1/completions", json=body) as resp:
                async for line in resp.content:
                    if line.startswith(b"data: {") and json.loads(line[6:]).get("choices"):
                        tokens += 1

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
        await asyncio.gather(*(one(session) for _ in range(args.clients)))
    return tokens


async def attacker(url: str, args, until: float, answers: Counter) -> None:
    payload = json.dumps({"model": "tandem", "prompt": "x" * int(args.body_mb * 1e6), "max_tokens": 4}).encode()

    async def one(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            try:
                async with session.post(url + "/v1/completions", data=payload,
                                        headers={"Content-Type": "application/json"}) as resp:
                    await resp.read()
                    answers[str(resp.status)] += 1
            except aiohttp.ClientError as exc:  # the gateway may close a connection whose body it will not read
                answers[type(exc).__name__] += 1

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(one(session) for _ in range(args.attackers)))


def phase(url: str, args, gateway: psutil.Process, attack: bool) -> dict:
    answers: Counter = Counter()
    cpu = gateway.cpu_times()
    started = time.monotonic()
    until = started + args.duration

    async def run() -> int:
        work = [clients(url, args, until)] + ([attacker(url, args, until, answers)] if attack else [])
        return (await asyncio.gather(*work))[0]

    tokens = asyncio.run(run())
    seconds = time.monotonic() - started
    after = gateway.cpu_times()
    result = {"tokens_per_s": round(tokens / seconds, 1),
              "gateway_cpu_s": round(after.user + after.system - cpu.user - cpu.system, 2)}
    if attack:
        result.update(attacks_per_s=round(sum(answers.values()) / seconds, 1), attack_answers=dict(answers))
    return result


def run(args) -> dict:
    from tests.procs import free_port, start, wait_http

    log_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-bodies-"))
    port, gw_port = free_port(), free_port()
    procs = [start("worker", ["-m", "inference.worker", "--role", "colocated", "--model", str(model_dir(args.model)),
                              "--dtype", "float32", "--threads", "1", "--kv-cache-bytes", "64M", "--port", str(port),
                              "--max-num-seqs", "16"], log_dir)]
    try:
        wait_http(procs[0], f"http://127.0.0.1:{port}/health", timeout=300)
        procs.append(start("gateway", ["-m", "inference.gateway", "--port", str(gw_port), "--colocated",
                                       f"http://127.0.0.1:{port}"], log_dir,
                           **({"cwd": args.gateway_src.resolve()} if args.gateway_src else {})))
        url = f"http://127.0.0.1:{gw_port}"
        wait_http(procs[1], url + "/health", timeout=60)
        gateway = psutil.Process(procs[1].popen.pid)
        phases = {"quiet_before": phase(url, args, gateway, False), "attack": phase(url, args, gateway, True),
                  "quiet_after": phase(url, args, gateway, False)}
    finally:
        for proc in reversed(procs):
            proc.stop()
    quiet = (phases["quiet_before"]["tokens_per_s"] + phases["quiet_after"]["tokens_per_s"]) / 2
    ratio = round(phases["attack"]["tokens_per_s"] / quiet, 3) if quiet else None
    return {"benchmark": "oversized_bodies", "worker": {"model": args.model, "dtype": "float32", "threads": 1},
            "gateway_src": str(args.gateway_src) if args.gateway_src else "this checkout",
            "clients": args.clients, "attackers": args.attackers, "body_mb": args.body_mb,
            "duration_s": args.duration, **phases, "attack_vs_quiet": ratio,
            "goals": {"others' throughput under the attack >= 0.9x": ratio is not None and ratio >= 0.9},
            "environment": environment()}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
