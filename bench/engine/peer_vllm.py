"""The peer operators would otherwise run, side by side: Tandem's engine against vLLM on the same model folder,
precision and threads, in the same run, through each one's OpenAI endpoint with the same streaming client.

Tandem: a colocated worker (`python -m inference.worker --role colocated --threads T`) behind its gateway. vLLM: its
OpenAI server from `make vllm`'s venv (`.venv-vllm`, or `--vllm-python`), `OMP_NUM_THREADS=T` with
`VLLM_CPU_OMP_THREADS_BIND` on the first T cores, compiled as vLLM starts by default (`--vllm-eager` skips it).
One engine runs at a time (the other is stopped), so each has the machine to itself; `--rounds` alternate them, and
each figure is the best over the rounds (a busy spell on a shared machine slows both alike).

Figures per engine and dtype: `ttft_s` of a ~`--prompt-tokens` prompt (best of 3 requests, nothing else running,
each prompt starting differently so that no prefix cache serves it),
`decode_tok_s` at each of `--streams` concurrent streams of `--new-tokens` tokens each (ignore_eos: the same work on
both sides; aggregate completion tokens over the wall time from the first request to the last token, the first
token's prefill included), and `ratios` Tandem / vLLM (above 1: Tandem is faster); `greedy_agreement`: each engine's
greedy completion of GREEDY_PROMPTS, and where they part, the two tokens' logit gap in Hugging Face's float32
forward. With the CPU's flags.

    make vllm && make models
    .venv/bin/python bench/engine/peer_vllm.py --dtypes float32 bfloat16 --threads 1
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import ROOT, emit, model_dir, ratio  # noqa: E402

NAME = "peer"
# Greedy completions compared between the engines (float32: token for token, or a near-tie where they part).
GREEDY_PROMPTS = ("The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,")
GREEDY_TOKENS = 48


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm" / "bin" / "python"))
    parser.add_argument("--vllm-eager", action="store_true", help="vLLM without torch.compile (faster to start)")
    parser.add_argument("--tandem-flag", action="append", default=[], metavar="FLAG",
                        help="an extra flag for Tandem's worker, e.g. --tandem-flag=--packed-weights (repeatable)")
    parser.add_argument("--start-timeout", type=float, default=900)
    return parser.parse_args(argv)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prompt_text(path: Path, num_tokens: int) -> tuple[str, int]:
    """Plain English-looking text of about num_tokens tokens under the model's tokenizer, and its exact count."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    words = ("the quick brown fox jumps over a lazy dog while seven rivers flow past old stone bridges and "
             "quiet towns where people read books about distant stars and ancient maps").split()
    text, i = "", 0
    while len(tokenizer.encode(text)) < num_tokens:
        text += " ".join(words[(i + k) % len(words)] for k in range(40)) + ". "
        i += 7
    return text, len(tokenizer.encode(text))


class Server:
    def __init__(self, procs: list[subprocess.Popen], url: str, logs: list[Path]):
        self.procs, self.url, self.logs = procs, url, logs

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _popen(argv: list[str], log: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env={**os.environ, **env},
                            cwd=ROOT, start_new_session=True)


def _wait(server: Server, timeout: float) -> None:
    import requests

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(proc.poll() is not None for proc in server.procs):
            raise RuntimeError(f"a server process exited: {server.logs[-1].read_text()[-2000:]}")
        try:
            answer = requests.post(f"{server.url}/v1/completions", timeout=30, json={
                "model": NAME, "prompt": "Hello", "max_tokens": 2})
            if answer.status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(1)
    server.stop()
    raise RuntimeError(f"not serving within {timeout:g} s")


def start_tandem(path: Path, dtype: str, threads: int, log_dir: Path, flags: list[str]) -> Server:
    worker_port, gateway_port = free_port(), free_port()
    env = {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    worker = _popen([sys.executable, "-m", "inference.worker", "--role", "colocated", "--model", str(path),
                     "--dtype", dtype, "--threads", str(threads), "--port", str(worker_port),
                     "--max-num-seqs", "128", *flags], log_dir / f"tandem-{dtype}.log", env)
    gateway = _popen([sys.executable, "-m", "inference.gateway", "--port", str(gateway_port), "--colocated",
                      f"http://127.0.0.1:{worker_port}", "--served-model-name", NAME,
                      "--max-outstanding-per-worker", "256"], log_dir / "gateway.log", env)
    return Server([worker, gateway], f"http://127.0.0.1:{gateway_port}",
                  [log_dir / "gateway.log", log_dir / f"tandem-{dtype}.log"])


def start_vllm(python: str, path: Path, dtype: str, threads: int, eager: bool, log_dir: Path) -> Server:
    port = free_port()
    env = {"OMP_NUM_THREADS": str(threads), "VLLM_CPU_OMP_THREADS_BIND": f"0-{threads - 1}" if threads > 1 else "0",
           "VLLM_CPU_KVCACHE_SPACE": "4", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(path), "--served-model-name", NAME,
            "--dtype", dtype, "--port", str(port), "--host", "127.0.0.1", "--max-num-seqs", "128",
            *(["--enforce-eager"] if eager else [])]
    log = log_dir / f"vllm-{dtype}.log"
    return Server([_popen(argv, log, env)], f"http://127.0.0.1:{port}", [log])


async def _stream(session, url: str, prompt: str, max_tokens: int) -> tuple[float, float, int]:
    """(seconds to the first token, seconds to the last, completion tokens) of one streamed completion."""
    started = time.perf_counter()
    first = last = None
    usage = 0
    async with session.post(f"{url}/v1/completions", json={
            "model": NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                now = time.perf_counter()
                first = first or now
                last = now
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
    return (first or time.perf_counter()) - started, (last or time.perf_counter()) - started, usage


async def _greedy(session, url: str, prompt: str) -> str:
    """The greedy completion of `prompt` (GREEDY_TOKENS tokens at most), as text."""
    async with session.post(f"{url}/v1/completions", json={
            "model": NAME, "prompt": prompt, "max_tokens": GREEDY_TOKENS, "temperature": 0}) as resp:
        resp.raise_for_status()
        return (await resp.json())["choices"][0]["text"]


def greedy_agreement(path: Path, tandem: list[str], vllm: list[str]) -> list[dict]:
    """Per GREEDY_PROMPTS prompt: whether both engines' greedy tokens agree, and where they part, how far apart the
    two tokens' logits lie there in Hugging Face's float32 forward over the common prefix (a near-tie: a small gap)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = None
    found = []
    for prompt, a, b in zip(GREEDY_PROMPTS, tandem, vllm):
        ids_a, ids_b = (tokenizer(prompt + text, add_special_tokens=False)["input_ids"] for text in (a, b))
        part = next((i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y), None)
        row = {"prompt": prompt, "identical": a == b, "tandem": a, "vllm": b}
        if part is not None:
            model = model or AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            with torch.inference_mode():
                logits = model(torch.tensor([ids_a[:part]])).logits[0, -1]
            row.update(first_divergence_token=part - len(tokenizer(prompt, add_special_tokens=False)["input_ids"]),
                       logit_gap=round(abs(logits[ids_a[part]] - logits[ids_b[part]]).item(), 4),
                       top2_gap=round((logits.topk(2).values[0] - logits.topk(2).values[1]).item(), 4))
        found.append(row)
    return found


async def measure(url: str, prompt: str, args) -> dict:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session:
        # Each prompt starts differently: a repeat would be served from the prefix cache (both engines keep one).
        ttfts = [(await _stream(session, url, f"Note {i} of {time.time_ns()}: {prompt}", 1))[0] for i in range(3)]
        figures = {"ttft_s": round(min(ttfts), 4)}
        figures["greedy"] = [await _greedy(session, url, text) for text in GREEDY_PROMPTS]
        short = "Write a long story about a lighthouse keeper."
        for streams in args.streams:
            started = time.perf_counter()
            done = await asyncio.gather(*(_stream(session, url, short, args.new_tokens) for _ in range(streams)))
            wall = time.perf_counter() - started
            figures[f"decode_tok_s_{streams}"] = round(sum(tokens for _, _, tokens in done) / wall, 2)
    return figures


def main(argv=None) -> int:
    args = parse_args(argv)
    from bench.lib.common import cpu_flags_of_interest

    path = model_dir(args.model)
    prompt, prompt_tokens = prompt_text(path, args.prompt_tokens)
    log_dir = Path(tempfile.mkdtemp(prefix="tandem-peer-vllm-"))
    best: dict[str, dict[str, dict]] = {"tandem": {}, "vllm": {}}
    for _ in range(args.rounds):
        for dtype in args.dtypes:
            for engine in ("tandem", "vllm"):
                server = (start_tandem(path, dtype, args.threads, log_dir, args.tandem_flag) if engine == "tandem" else
                          start_vllm(args.vllm_python, path, dtype, args.threads, args.vllm_eager, log_dir))
                started = time.monotonic()
                try:
                    _wait(server, args.start_timeout)
                    ready_s = time.monotonic() - started
                    figures = asyncio.run(measure(server.url, prompt, args))
                finally:
                    server.stop()
                figures["ready_s"] = round(ready_s, 1)
                kept = best[engine].setdefault(dtype, {})
                kept.setdefault("greedy", figures.pop("greedy"))
                for key, value in figures.items():
                    better = min if key in ("ttft_s", "ready_s") else max
                    kept[key] = better(kept.get(key, value), value)
    ratios = {dtype: {key: (ratio(best["vllm"][dtype][key], best["tandem"][dtype][key]) if key == "ttft_s" else
                            ratio(best["tandem"][dtype][key], best["vllm"][dtype][key]))
                      for key in best["tandem"][dtype] if key not in ("ready_s", "greedy")} for dtype in args.dtypes}
    agreement = {dtype: greedy_agreement(path, best["tandem"][dtype].pop("greedy"), best["vllm"][dtype].pop("greedy"))
                 for dtype in args.dtypes}
    vllm_version = subprocess.run([args.vllm_python, "-c", "import vllm; print(vllm.__version__)"],
                                  capture_output=True, text=True).stdout.strip().splitlines()[-1:]
    emit({"benchmark": "peer_vllm", "model": str(path), "threads": args.threads, "prompt_tokens": prompt_tokens,
          "new_tokens": args.new_tokens, "rounds": args.rounds, "vllm_compiled": not args.vllm_eager,
          "tandem_flags": args.tandem_flag,
          "tandem": best["tandem"], "vllm": best["vllm"],
          "ratios_tandem_over_vllm": ratios, "greedy_agreement": agreement, "cpu_flags": cpu_flags_of_interest(),
          "vllm_version": vllm_version[0] if vllm_version else None, "load_avg": os.getloadavg(),
          "logs": str(log_dir)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
