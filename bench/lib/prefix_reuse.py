"""Prefix caching sections of bench/engine/faster_tokens.py.

- `prefix_ttft`: the engine (the run's model, float32, the run's threads, chunked prefill at its CPU default) serves a
  request that shares a 1,000-token prefix with an earlier one; its time to first token against the same request
  cold (the prefix cache flushed first). Best of `--repeats` rounds, each with its own suffixes, so that only the
  shared prefix can be found.
- `prefix_routing`: 4 real prefill workers (tiny model, prefix caching on) and a decode worker behind a real gateway;
  chats under 8 distinct system prompts, from a few concurrent clients; the prefill workers' prefix cache hit rate
  (hit / queried prompt tokens, from their own /metrics) with prefix affinity against least-outstanding routing
  (`--no-prefix-affinity`). Each routing mode gets its own 8 system prompts, so nothing one leaves cached helps the
  other.
"""
from __future__ import annotations

import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench.lib.common import ratio

PREFIX_TOKENS = 1000
SUFFIX_TOKENS = 24
NUM_PREFILL_WORKERS = 4
NUM_SYSTEM_PROMPTS = 8
CHATS_PER_SYSTEM_PROMPT = 12
NUM_CLIENTS = 4
WORDS = ("bread oven flour yeast crust crumb rye wheat dough proof knead bake loaf starter sugar salt butter milk "
         "order delivery opening hours menu price customer counter shelf basket tray morning evening").split()


def ttft_section(ctx: dict, args) -> dict:
    from inference.engine import SamplingParams

    engine = ctx["fp32_engine"]
    assert engine.prefix_caching, "the float32 engine runs with prefix caching on (the default)"
    rng = random.Random(11)
    vocab = engine.model_runner.vocab_size

    def tokens(n):
        return [rng.randrange(3, vocab) for _ in range(n)]

    def ttft(prompt) -> float:
        start = time.perf_counter()
        engine.generate([prompt], SamplingParams(max_tokens=1))
        return time.perf_counter() - start

    prefix = tokens(PREFIX_TOKENS)
    cold, warm, hit_tokens = [], [], []
    for _ in range(max(2, args.repeats)):
        earlier, request = prefix + tokens(SUFFIX_TOKENS), prefix + tokens(SUFFIX_TOKENS)
        engine.block_manager.flush_prefix_cache()
        cold.append(ttft(request))
        engine.block_manager.flush_prefix_cache()
        ttft(earlier)
        before = engine.stats()["prefix_cache_hit_tokens"]
        warm.append(ttft(request))
        hit_tokens.append(engine.stats()["prefix_cache_hit_tokens"] - before)
    engine.block_manager.flush_prefix_cache()
    out = {"dtype": engine.dtype, "threads": args.threads, "prefix_tokens": PREFIX_TOKENS,
           "suffix_tokens": SUFFIX_TOKENS, "chunked_prefill": engine.config.chunked_prefill,
           "prefill_chunk_size": engine.config.prefill_chunk_size,
           "cold_ttft_s": round(min(cold), 4), "warm_ttft_s": round(min(warm), 4),
           "hit_tokens": hit_tokens[0], "warm_vs_cold": ratio(min(warm), min(cold))}
    ctx["goals"]["prefix_ttft_warm_vs_cold"] = out["warm_vs_cold"]
    return out


def _system_prompts(seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"System {seed}-{i}: you are the assistant of bakery number {rng.randrange(10**6)}. "
            + " ".join(rng.choice(WORDS) for _ in range(180)) for i in range(NUM_SYSTEM_PROMPTS)]


def _counters(session, urls: list[str]) -> tuple[float, float]:
    queried = hit = 0.0
    for url in urls:
        for line in session.get(url + "/metrics", timeout=30).text.splitlines():
            if line.startswith("tandem_prefix_cache_queried_tokens_total{"):
                queried += float(line.rsplit(" ", 1)[1])
            elif line.startswith("tandem_prefix_cache_hit_tokens_total{"):
                hit += float(line.rsplit(" ", 1)[1])
    return queried, hit


def _ceiling(tokenizer, chats: list[tuple[str, str]], block_size: int = 16) -> float:
    """The hit rate if every chat but the first of each system prompt found all the full blocks it shares with
    the earlier ones (the most any routing can get from a cold start)."""
    seen: dict[str, list[int]] = {}
    queried = hit = 0
    for system, user in chats:
        ids = tokenizer.apply_chat_template([{"role": "system", "content": system}, {"role": "user", "content": user}],
                                            tokenize=True, add_generation_prompt=True)
        ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        queried += len(ids)
        earlier = seen.setdefault(system, ids)
        if earlier is not ids:
            common = next((i for i, (a, b) in enumerate(zip(ids, earlier)) if a != b), min(len(ids), len(earlier)))
            hit += min(common, len(ids) - 1) // block_size * block_size
    return round(hit / queried, 4)


def _decisions(session, gateway_url: str) -> dict[str, float]:
    out = {"affinity": 0.0, "spilled": 0.0}
    for line in session.get(gateway_url + "/metrics", timeout=30).text.splitlines():
        if line.startswith("tandem_gateway_prefix_routing_total{") and 'stage="prefill"' in line:
            for decision in out:
                if f'decision="{decision}"' in line:
                    out[decision] += float(line.rsplit(" ", 1)[1])
    return out


def _load(gateway_url: str, prefill_urls: list[str], seed: int, tokenizer) -> dict:
    import requests

    systems = _system_prompts(seed)
    rng = random.Random(seed)
    chats = [(system, f"Question {n}: " + " ".join(rng.choice(WORDS) for _ in range(6)))
             for system in systems for n in range(CHATS_PER_SYSTEM_PROMPT)]
    rng.shuffle(chats)
    session = requests.Session()
    queried0, hit0 = _counters(session, prefill_urls)

    def send(chat) -> int:
        system, user = chat
        r = requests.post(gateway_url + "/v1/chat/completions", timeout=300, json={
            "model": "tandem", "max_tokens": 2, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]})
        return r.status_code

    start = time.perf_counter()
    with ThreadPoolExecutor(NUM_CLIENTS) as pool:
        statuses = list(pool.map(send, chats))
    elapsed = time.perf_counter() - start
    queried, hit = _counters(session, prefill_urls)
    queried, hit = queried - queried0, hit - hit0
    return {"requests": len(chats), "ok": statuses.count(200), "seconds": round(elapsed, 2),
            "queried_tokens": int(queried), "hit_tokens": int(hit),
            "hit_rate": round(hit / queried, 4) if queried else None,
            "ceiling_hit_rate": _ceiling(tokenizer, chats), "gateway_decisions": _decisions(session, gateway_url)}


def routing_section(ctx: dict, args) -> dict:
    from bench.lib.common import model_dir
    from tests.procs import free_port, start, wait_http

    from transformers import AutoTokenizer

    path = model_dir("tiny")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    log_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-prefix-"))
    worker_args = ["--model", str(path), "--threads", "1", "--kv-cache-bytes", "32M"]
    procs, prefill_urls = [], []
    out: dict = {"model": "tiny", "prefill_workers": NUM_PREFILL_WORKERS, "system_prompts": NUM_SYSTEM_PROMPTS,
                 "chats_per_system_prompt": CHATS_PER_SYSTEM_PROMPT, "clients": NUM_CLIENTS}
    try:
        for i in range(NUM_PREFILL_WORKERS + 1):
            role = "prefill" if i < NUM_PREFILL_WORKERS else "decode"
            port = free_port()
            procs.append(start(f"{role}-{i}", ["-m", "inference.worker", "--role", role, "--port", str(port),
                                               *worker_args], log_dir))
            procs[-1].url = f"http://127.0.0.1:{port}"
        for proc in procs:
            wait_http(proc, proc.url + "/health", timeout=300)
        prefill_urls = [p.url for p in procs[:NUM_PREFILL_WORKERS]]
        for seed, (label, flag) in enumerate((("least_outstanding", "--no-prefix-affinity"),
                                              ("cache_aware", "--prefix-affinity")), start=1):
            port = free_port()
            gateway = start(f"gateway-{label}", ["-m", "inference.gateway", "--port", str(port), "--prefill",
                                                 ",".join(prefill_urls), "--decode", procs[-1].url, flag], log_dir)
            try:
                wait_http(gateway, f"http://127.0.0.1:{port}/health", timeout=120)
                out[label] = _load(f"http://127.0.0.1:{port}", prefill_urls, seed, tokenizer)
            finally:
                gateway.stop()
    finally:
        for proc in reversed(procs):
            proc.stop()
    out["cache_aware_vs_least_outstanding"] = ratio(out["cache_aware"]["hit_rate"],
                                                    out["least_outstanding"]["hit_rate"])
    ctx["goals"]["prefix_routing_cache_aware_hit_rate"] = out["cache_aware"]["hit_rate"]
    return out
