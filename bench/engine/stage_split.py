"""What splitting prefill from decode buys, on equal cores: colocated, colocated with chunked prefill, and
disaggregated (prefill + decode workers), each behind a real gateway, streamed through its OpenAI API.

Every mode gets --threads torch threads in all: colocated is one worker with all of them; disaggregated gives half
to a prefill worker and half to a decode worker. Per mode, three loads, one after the other:
1. long_alone: --long-alone-requests long prompts, one at a time (the long prompt's own TTFT, the baseline of the
   long-prompt goal);
2. short: --short-concurrency streams back to back, each a ~--short-prompt-tokens prompt and --short-max-tokens
   greedy tokens (EOS ignored), for --duration seconds;
3. short+long: the same, plus one long prompt (--long-prompt-tokens, --long-max-tokens new tokens) every
   --long-interval seconds.
After a load's --duration no new request starts; those in flight get --drain-timeout seconds, and any still open
then is cancelled and counted in `unfinished` (a long one with no first token by then counts its wait so far as its
TTFT: a lower bound).

Reported per mode and load: short-stream ITL P50/P99/max (the gaps between SSE chunks as the client sees them), TTFT
P50/P99 of short and long requests, short tokens per second, and goodput: requests per second that meet the
objectives under "objectives" (TTFT, and mean ITL for the streams). Goals, each a ratio within this run (see
GOALS); ratios near 1 on a loaded shared machine are noisy, so read them with the load average in "environment".

    python bench/engine/stage_split.py               # SmolLM2, 2 threads, several minutes
    python bench/engine/stage_split.py --modes disaggregated --duration 20
"""
from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import bootstrap, emit, environment, model_dir, ratio  # noqa: E402

SERVED_NAME = "bench"
LOADS = ("long_alone", "short", "short+long")
# mode -> the workers it runs: (role, share of --threads, chunked prefill)
MODES = {
    "colocated": [("colocated", 1.0, False)],
    "colocated_chunked": [("colocated", 1.0, True)],
    "disaggregated": [("prefill", 0.5, True), ("decode", 0.5, True)],
    "disaggregated_unchunked": [("prefill", 0.5, False), ("decode", 0.5, True)],  # main's prefill worker; opt-in
}
DEFAULT_MODES = "colocated,colocated_chunked,disaggregated"
# (name, mode, metric, load with, load without, at most)
GOALS = [
    ("disaggregated.short_itl_p99_ratio<=1.5", "disaggregated", "short_itl_p99", "short+long", "short", 1.5),
    ("disaggregated.short_ttft_p99_ratio<=2", "disaggregated", "short_ttft_p99", "short+long", "short", 2.0),
    ("colocated_chunked.short_itl_p99_ratio<=3", "colocated_chunked", "short_itl_p99", "short+long", "short", 3.0),
    *[(f"{mode}.long_ttft_p99_ratio<=1.5", mode, "long_ttft_p99", "short+long", "long_alone", 1.5)
      for mode in MODES],
]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="tiny, smollm2 or a model folder")
    p.add_argument("--dtype", default="auto", help="the workers' --dtype (auto: SmolLM2's own bfloat16)")
    p.add_argument("--threads", type=int, default=2, help="torch threads per mode, all workers together")
    p.add_argument("--modes", default=DEFAULT_MODES, help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--prefill-chunk-size", type=int, default=None, help="the workers' (default: theirs)")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of the short and short+long loads")
    p.add_argument("--drain-timeout", type=float, default=45.0)
    p.add_argument("--short-concurrency", type=int, default=4)
    p.add_argument("--short-prompt-tokens", type=int, default=20)
    p.add_argument("--short-max-tokens", type=int, default=48)
    p.add_argument("--long-prompt-tokens", type=int, default=2000)
    p.add_argument("--long-max-tokens", type=int, default=4)
    p.add_argument("--long-interval", type=float, default=4.0, help="seconds between long prompts (short+long)")
    p.add_argument("--long-alone-requests", type=int, default=2)
    p.add_argument("--slo-short-ttft", type=float, default=1.0, help="seconds: a short request's TTFT objective")
    p.add_argument("--slo-long-ttft", type=float, default=20.0, help="seconds: a long request's TTFT objective")
    p.add_argument("--slo-itl", type=float, default=0.25,
                   help="seconds: a stream's mean inter-token latency objective")
    args = p.parse_args(argv)
    args.modes = [m for m in args.modes.split(",") if m]
    if unknown := set(args.modes) - set(MODES):
        p.error(f"unknown modes {sorted(unknown)}; choose from {', '.join(MODES)}")
    return args


def prompt_texts(path: Path, num_tokens: int, count: int, offset: int) -> list[str]:
    """`count` distinct texts of about num_tokens tokens each (workers take text and count tokens themselves)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.model_max_length = 1 << 30  # only counting tokens here
    bench = Path(__file__).resolve().parents[1]  # the benches' own sources, as text (no hidden folders: venvs)
    source = "".join(p.read_text() for p in sorted(bench.glob("*/*.py")) if not p.parent.name.startswith(".")) * 2
    ids = tokenizer(source)["input_ids"]
    return [tokenizer.decode(ids[offset + i * 37:][:num_tokens]) for i in range(count)]


# -- one request, as a streaming client sees it -------------------------------------------------------------------

async def stream_request(session, url: str, prompt: str, max_tokens: int, record: dict) -> None:
    """POST a streaming completion; fill record with start, chunk arrival times, completion tokens."""
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    record["start"] = time.monotonic()
    record["chunks"] = []
    async with session.post(f"{url}/v1/completions", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"gateway HTTP {r.status}: {(await r.text())[:300]}")
        async for raw in r.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"stream failed: {event['error']}")
            if event.get("usage"):
                record["completion_tokens"] = event["usage"]["completion_tokens"]
            if any(choice.get("text") for choice in event.get("choices", [])):
                record["chunks"].append(time.monotonic())
    record["end"] = time.monotonic()


async def run_load(url: str, load: str, texts: dict, args) -> dict:
    import aiohttp

    records: dict[str, list[dict]] = {"short": [], "long": []}
    started = time.monotonic()
    stop_at = started + args.duration

    async def one(kind: str, prompt: str, max_tokens: int) -> None:
        record: dict = {}
        records[kind].append(record)
        try:
            await stream_request(session, url, prompt, max_tokens, record)
        except asyncio.CancelledError:
            record["unfinished"] = True
            raise
        except Exception as exc:
            record["error"] = str(exc)

    async def short_client(i: int) -> None:
        n = 0
        while time.monotonic() < stop_at:
            await one("short", texts["short"][(i + n * args.short_concurrency) % len(texts["short"])],
                      args.short_max_tokens)
            n += 1

    async def long_client() -> None:
        tasks, n = [], 0
        while time.monotonic() < stop_at:
            tasks.append(asyncio.ensure_future(one("long", texts["long"][n % len(texts["long"])],
                                                   args.long_max_tokens)))
            n += 1
            await asyncio.sleep(args.long_interval)
        await asyncio.gather(*tasks)

    timeout = aiohttp.ClientTimeout(total=None, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        if load == "long_alone":
            for i in range(args.long_alone_requests):
                await one("long", texts["long"][i % len(texts["long"])], args.long_max_tokens)
        else:
            clients = [asyncio.ensure_future(short_client(i)) for i in range(args.short_concurrency)]
            if load == "short+long":
                clients.append(asyncio.ensure_future(long_client()))
            remaining = max(1.0, stop_at + args.drain_timeout - time.monotonic())
            done, pending = await asyncio.wait(clients, timeout=remaining)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    ended = time.monotonic()
    for kind in records:
        for record in records[kind]:
            record.setdefault("end", ended)
    return summarize(records, ended - started, args)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = q / 100 * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (rank - low), 4)


def summarize(records: dict, seconds: float, args) -> dict:
    def ttft(record: dict) -> float | None:
        if record.get("chunks"):
            return record["chunks"][0] - record["start"]
        if record.get("unfinished") and "start" in record:  # no first token before cancellation: a lower bound
            return record["end"] - record["start"]
        return None

    short, long = records["short"], records["long"]
    itls, short_ttfts, good, short_tokens = [], [], 0, 0
    for record in short:
        chunks = record.get("chunks", [])
        gaps = [b - a for a, b in zip(chunks, chunks[1:])]
        itls += gaps
        if (value := ttft(record)) is not None:
            short_ttfts.append(value)
        if record.get("completion_tokens") and not record.get("error"):
            short_tokens += record["completion_tokens"]
            mean_itl = sum(gaps) / len(gaps) if gaps else 0.0
            if value is not None and value <= args.slo_short_ttft and mean_itl <= args.slo_itl:
                good += 1
    long_ttfts = [value for record in long if (value := ttft(record)) is not None]
    good += sum(1 for record in long if record.get("completion_tokens") and not record.get("error")
                and ttft(record) <= args.slo_long_ttft)
    return {
        "seconds": round(seconds, 1),
        "short_requests": sum(1 for r in short if r.get("completion_tokens")),
        "long_requests": sum(1 for r in long if r.get("completion_tokens")),
        "unfinished": sum(1 for r in short + long if r.get("unfinished")),
        "errors": [r["error"] for r in short + long if r.get("error")][:5],
        "short_itl_p50": percentile(itls, 50), "short_itl_p99": percentile(itls, 99),
        "short_itl_max": round(max(itls), 4) if itls else None,
        "short_ttft_p50": percentile(short_ttfts, 50), "short_ttft_p99": percentile(short_ttfts, 99),
        "long_ttft_p50": percentile(long_ttfts, 50), "long_ttft_p99": percentile(long_ttfts, 99),
        "short_tokens_per_s": round(short_tokens / seconds, 2) if short else None,
        "goodput_rps": round(good / seconds, 3),
    }


# -- processes ----------------------------------------------------------------------------------------------------

def start_mode(mode: str, path: Path, log_dir: Path, args, procs: list) -> str:
    """Start the mode's workers and gateway (appended to `procs` as they start, so that a failure or a signal half
    way still stops them); return the gateway's URL."""
    from tests.procs import free_port, start, wait_http

    urls = {}
    for role, share, chunked in MODES[mode]:
        port = free_port()
        threads = max(1, round(args.threads * share))
        flags = ["--role", role, "--model", str(path), "--port", str(port), "--threads", str(threads),
                 "--dtype", args.dtype, "--kv-cache-bytes", str(512 << 20)]
        flags += [] if chunked else ["--no-chunked-prefill"]
        if args.prefill_chunk_size:
            flags += ["--prefill-chunk-size", str(args.prefill_chunk_size)]
        proc = start(f"{mode}-{role}", ["-m", "inference.worker", *flags], log_dir,
                     env={"OMP_NUM_THREADS": str(threads)})
        procs.append(proc)
        urls[role] = f"http://127.0.0.1:{port}"
    for proc, url in zip(procs, urls.values()):
        wait_http(proc, f"{url}/health", timeout=180)
    gateway_port = free_port()
    gateway = start(f"{mode}-gateway", ["-m", "inference.gateway", "--port", str(gateway_port),
                                        "--served-model-name", SERVED_NAME, "--request-timeout", "900",
                                        *[a for role, url in urls.items() for a in (f"--{role}", url)]], log_dir)
    procs.append(gateway)
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    wait_http(gateway, f"{gateway_url}/v1/models", timeout=60)
    return gateway_url


def wait_until_serving(url: str, text: str, deadline_s: float) -> None:
    """The gateway learns of its workers by health probes: a 503 until then is expected. Also warms them up."""
    import requests

    deadline = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < deadline:
        try:
            r = requests.post(f"{url}/v1/completions", json={"model": SERVED_NAME, "prompt": text, "max_tokens": 2},
                              timeout=max(1.0, deadline - time.monotonic()))
        except requests.RequestException as exc:
            last = repr(exc)
            continue
        if r.status_code == 200:
            return
        last = r.text[:300]
        time.sleep(0.3)
    raise RuntimeError(f"gateway not serving after {deadline_s}s: {last}")


def run(args) -> dict:
    bootstrap()
    path = model_dir(args.model)
    texts = {"short": prompt_texts(path, args.short_prompt_tokens, 64, offset=0),
             "long": prompt_texts(path, args.long_prompt_tokens, 8, offset=1000)}
    log_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-split-"))
    results: dict[str, dict] = {}
    errors: dict[str, str] = {}
    for mode in args.modes:
        procs: list = []
        try:
            url = start_mode(mode, path, log_dir, args, procs)
            wait_until_serving(url, texts["short"][0], deadline_s=120)
            # The long path too (a worker's first long prefill is its slowest); minutes on a loaded machine.
            wait_until_serving(url, texts["long"][-1], deadline_s=600)
            results[mode] = {}
            for load in LOADS:
                print(f"[stage_split] {mode} / {load} ...", file=sys.stderr, flush=True)
                results[mode][load] = asyncio.run(run_load(url, load, texts, args))
        except Exception as exc:
            errors[mode] = f"{type(exc).__name__}: {exc} (logs in {log_dir})"
        finally:
            for proc in reversed(procs):
                proc.stop()
    goals, ratios = {}, {}
    for name, mode, metric, with_load, without_load, at_most in GOALS:
        if mode not in results:
            continue
        value = ratio(results[mode].get(with_load, {}).get(metric), results[mode].get(without_load, {}).get(metric))
        ratios[name.split("<=")[0]] = value
        goals[name] = None if value is None else value <= at_most
    return {
        "benchmark": "stage_split", "model": args.model, "dtype": args.dtype, "threads_per_mode": args.threads,
        "workers": {mode: [{"role": r, "threads": max(1, round(args.threads * s)), "chunked_prefill": c}
                           for r, s, c in MODES[mode]] for mode in args.modes},
        "prefill_chunk_size": args.prefill_chunk_size or "worker default",
        "loads": {"duration_s": args.duration, "short_concurrency": args.short_concurrency,
                  "short_prompt_tokens": args.short_prompt_tokens, "short_max_tokens": args.short_max_tokens,
                  "long_prompt_tokens": args.long_prompt_tokens, "long_max_tokens": args.long_max_tokens,
                  "long_interval_s": args.long_interval, "long_alone_requests": args.long_alone_requests},
        "objectives": {"short_ttft_s": args.slo_short_ttft, "long_ttft_s": args.slo_long_ttft,
                       "mean_itl_s": args.slo_itl,
                       "goodput": "requests per second that finished and met their TTFT objective (and, for "
                                  "short streams, the mean-ITL one)"},
        "results": results, "ratios": ratios, "goals": goals, "errors": errors, "environment": environment(),
    }


def main(argv=None) -> int:
    # SIGTERM ends the run through the `finally` that stops this run's workers and gateways.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    doc = run(parse_args(argv))
    emit(doc)
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
