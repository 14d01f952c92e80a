"""Time to first token of a short request that arrives while a colocated worker's steps run: prefilled between the
running step's layers (`interleave_prefill`, the default) against waiting for the step's end
(`--no-interleave-prefill`), at the worker itself (its /v1/generate, no gateway), in one run.

One real worker at a time (float32, one thread, --slots sequences), each given the same load: --streams closed-loop
streams of --long-tokens tokens (tenant `noisy`) and a short request of --short-tokens tokens every --interval s
(tenant `quiet`), both with a 4-word prompt; the slots are enough for all of them (no request waits for a sequence),
so what a short request waits for is the step under way and its own prefill. Reported per worker: the short
requests' TTFT alone first (unloaded) and under the load (P50, P90, the worst three), and the long streams' tokens/s
(what the pauses cost them).

    python bench/engine/arrival_ttft.py                       # SmolLM2, a few minutes
    python bench/engine/arrival_ttft.py --model tiny --duration 10
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import emit, environment, model_dir, ratio  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="tiny, smollm2 or a model folder (float32, 1 thread)")
    p.add_argument("--slots", type=int, default=8, help="the worker's --max-num-seqs")
    p.add_argument("--streams", type=int, default=5, help="long streams in flight")
    p.add_argument("--long-tokens", type=int, default=64)
    p.add_argument("--short-tokens", type=int, default=16)
    p.add_argument("--interval", type=float, default=0.5, help="seconds between short requests")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of load per worker")
    args = p.parse_args(argv)
    if args.streams + 3 > args.slots:
        p.error(f"--streams {args.streams} leaves too few of --slots {args.slots} for the short requests in flight")
    return args


class Client:
    def __init__(self, session, url: str) -> None:
        self.session, self.url = session, url
        self.num_long_tokens = 0

    async def request(self, tenant: str, max_tokens: int) -> float:
        """The request's TTFT in seconds (it runs to its end)."""
        body = {"request_id": f"{tenant}-{time.monotonic_ns()}", "prompt": "one two three four",
                "max_tokens": max_tokens, "ignore_eos": True, "cache_salt": tenant}
        started, ttft = time.monotonic(), None
        async with self.session.post(self.url + "/v1/generate", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{resp.status}: {await resp.text()}")
            async for line in resp.content:
                event = json.loads(line)
                if event["type"] == "token":
                    ttft = ttft if ttft is not None else time.monotonic() - started
                    if tenant == "noisy":
                        self.num_long_tokens += len(event.get("token_ids") or ())
                elif event["type"] == "error":
                    raise RuntimeError(event["message"])
        return ttft


async def measure(url: str, args) -> dict:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        client = Client(session, url)
        unloaded = [await client.request("quiet", args.short_tokens) for _ in range(10)]
        started = time.monotonic()
        end = started + args.duration
        short: list[float] = []

        async def long_stream() -> None:
            while time.monotonic() < end:
                await client.request("noisy", args.long_tokens)

        async def short_requests() -> None:
            await asyncio.sleep(min(3.0, args.duration / 4))  # the streams under way first
            pending = []
            while time.monotonic() < end:
                pending.append(asyncio.ensure_future(client.request("quiet", args.short_tokens)))
                await asyncio.sleep(args.interval)
            short.extend(await asyncio.gather(*pending))

        await asyncio.gather(*(long_stream() for _ in range(args.streams)), short_requests())
        elapsed = time.monotonic() - started
    short.sort()
    p50 = statistics.median(short)
    return {"unloaded_ttft_p50_s": round(statistics.median(unloaded), 4), "num_short": len(short),
            "ttft_p50_s": round(p50, 4), "ttft_p90_s": round(short[int(0.9 * (len(short) - 1))], 4),
            "ttft_worst_s": [round(t, 4) for t in short[-3:]],
            "ttft_p50_vs_unloaded": ratio(p50, statistics.median(unloaded)),
            "long_tokens_per_s": round(client.num_long_tokens / elapsed, 1)}


def run(args) -> dict:
    from tests.procs import free_port, start, wait_http

    log_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-arrival-"))
    results = {}
    for name, flags in (("interleave", []), ("step_end", ["--no-interleave-prefill"])):
        port = free_port()
        worker = start(f"worker-{name}", ["-m", "inference.worker", "--role", "colocated", "--model",
                                          str(model_dir(args.model)), "--dtype", "float32", "--threads", "1",
                                          "--kv-cache-bytes", "256M", "--port", str(port),
                                          "--max-num-seqs", str(args.slots), *flags], log_dir)
        try:
            url = f"http://127.0.0.1:{port}"
            wait_http(worker, url + "/health", timeout=120)
            results[name] = asyncio.run(measure(url, args))
        finally:
            worker.stop()
    on, off = results["interleave"], results["step_end"]
    return {"benchmark": "arrival_ttft", "model": args.model, "dtype": "float32", "slots": args.slots,
            "streams": args.streams, "long_tokens": args.long_tokens, "short_tokens": args.short_tokens,
            "interval_s": args.interval, "duration_s": args.duration, **results,
            "ttft_p50_step_end_vs_interleave": ratio(off["ttft_p50_s"], on["ttft_p50_s"]),
            "long_tokens_per_s_interleave_vs_step_end": ratio(on["long_tokens_per_s"], off["long_tokens_per_s"]),
            "environment": environment()}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
