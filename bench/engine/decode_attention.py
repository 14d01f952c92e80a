"""Decode attention on a CPU: Tandem's paged kernel (inference/engine/kernels/paged_attention.c, K/V read in place) against
torch's path (every block gathered into a padded copy, a mask, SDPA), in the same run.

- `calls`: one layer's attention call at SmolLM2-135M's shapes (9 query / 3 KV heads, head dim 64, blocks of 16), per
  dtype, number of sequences and context, each sequence's blocks scattered through the pool as after churn. Each
  timed round calls every layer of a pool big enough to come from memory rather than from cache (as a step calls 30
  layers'), interleaved kernel / torch, best round kept; `gb_s` is the K/V bytes of the context over the call's time.
- `engine`: whole decode steps of SmolLM2 (float32 unless told) through LLMEngine.step, one stream at a long context
  and 16 streams, with the kernel (`matvec` auto) and with the kernel's attention switched off in an otherwise
  identical engine (torch's attention, Tandem's matvec linears): the difference is the attention's share of a step.
  Steps alternate between the two engines in rounds; the median step is kept. With `--kv-cache-dtypes`, an engine
  per narrower KV cache beside them (Config.kv_cache_dtype: float16 or bfloat16 beside float32), the kernel reading
  half the bytes: `kernel_kv_float16`, ...

    python bench/engine/decode_attention.py --threads 1
    python bench/engine/decode_attention.py --threads 1 --sections calls --dtypes float32
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import emit, model_dir, random_prompts, ratio, run_sections  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, SCALE = 9, 3, 64, 16, 0.125  # SmolLM2-135M's
POOL_BYTES = 256 << 20  # K and V of all the layers a round calls: past the private caches, most of a shared L3
SECTIONS = ("calls", "engine")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--dtypes", default="float32,bfloat16", help="calls: the cache dtypes")
    p.add_argument("--contexts", default="128,1024,2048", help="calls: context lengths")
    p.add_argument("--batches", default="1,16", help="calls: numbers of sequences")
    p.add_argument("--rounds", type=int, default=7, help="calls: interleaved timed rounds, the best kept")
    p.add_argument("--model", default="smollm2", help="engine: tiny, smollm2 or a model folder")
    p.add_argument("--engine-dtype", default="float32")
    p.add_argument("--long-context", type=int, default=1024, help="engine: the single stream's prompt tokens")
    p.add_argument("--batch-context", type=int, default=256, help="engine: each of the 16 streams' prompt tokens")
    p.add_argument("--steps", type=int, default=24, help="engine: timed decode steps per engine and case")
    p.add_argument("--kv-cache-dtypes", default="float16",
                   help="engine: narrower KV caches to time beside the model's (comma-separated; '' for none)")
    args = p.parse_args(argv)
    args.sections = [s for s in args.sections.split(",") if s]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.contexts = [int(c) for c in args.contexts.split(",") if c]
    args.batches = [int(b) for b in args.batches.split(",") if b]
    return args


def attention_calls(dtype: str, num_seqs: int, context: int, threads: int) -> tuple[dict, int, int]:
    """({"kernel": call(layer), "torch": call(layer)}, layers in the pool, K/V bytes one call reads)."""
    import torch

    from inference.engine.kernels import paged_attention
    from inference.engine.attention import DecodeAttention

    torch_dtype = getattr(torch, dtype)
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = num_seqs * blocks_per_seq + 1
    layer_bytes = 2 * num_blocks * BLOCK_SIZE * KV_HEADS * HEAD_DIM * torch_dtype.itemsize
    num_layers = max(2, min(30, math.ceil(POOL_BYTES / layer_bytes)))
    gen = torch.Generator().manual_seed(0)
    shape = (num_layers, num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    k_cache, v_cache = (torch.randn(shape, generator=gen).to(torch_dtype) for _ in range(2))
    blocks = torch.randperm(num_blocks - 1, generator=gen).add(1)  # scattered, as a pool is after churn
    tables = blocks[:num_seqs * blocks_per_seq].view(num_seqs, blocks_per_seq)  # [B, M]
    context_lens = torch.full((num_seqs,), context, dtype=torch.long)
    q = torch.randn(num_seqs, HEADS, HEAD_DIM, generator=gen).to(torch_dtype)
    span = torch.arange(blocks_per_seq * BLOCK_SIZE)
    mask = (span.unsqueeze(0) < context_lens.unsqueeze(1))[:, None, None, :]  # made once per step, as the runner does
    torchs = DecodeAttention(k_cache, v_cache, tables, mask)
    kernel = DecodeAttention(k_cache, v_cache, tables, None, paged_attention.PagedDecode(
        paged_attention.load()[0], k_cache, v_cache, tables, context_lens, threads))
    calls = {"kernel": lambda layer: kernel(layer, q, None, None, SCALE),
             "torch": lambda layer: torchs(layer, q, None, None, SCALE)}
    diff = (calls["kernel"](0).float() - calls["torch"](0).float()).abs().max().item()
    assert diff <= (1e-4 if dtype == "float32" else 0.05), diff
    return calls, num_layers, num_seqs * context * KV_HEADS * HEAD_DIM * 2 * torch_dtype.itemsize


def calls_section(args) -> dict:
    from inference.engine.kernels import paged_attention

    library, reason = paged_attention.load()
    if library is None:
        return {"skipped": reason}
    out: dict = {"isa": library.isa, "shapes": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                                                 "block_size": BLOCK_SIZE}, "results": {}}
    for dtype in args.dtypes:
        for num_seqs in args.batches:
            for context in args.contexts:
                calls, num_layers, num_bytes = attention_calls(dtype, num_seqs, context, args.threads)
                best = {name: math.inf for name in calls}
                best_cpu = {name: math.inf for name in calls}
                for name, call in calls.items():  # warm: first touch of pages, lazy init
                    for layer in range(num_layers):
                        call(layer)
                for _ in range(args.rounds):
                    for name, call in calls.items():
                        start, cpu = time.perf_counter(), time.thread_time()
                        for layer in range(num_layers):
                            call(layer)
                        best_cpu[name] = min(best_cpu[name], (time.thread_time() - cpu) / num_layers)
                        best[name] = min(best[name], (time.perf_counter() - start) / num_layers)
                out["results"][f"{dtype}/seqs{num_seqs}/ctx{context}"] = {
                    "layers_in_pool": num_layers,
                    **{name: {"us": round(s * 1e6, 1), "cpu_us": round(best_cpu[name] * 1e6, 1),
                              "gb_s": round(num_bytes / s / 1e9, 2)} for name, s in best.items()},
                    "speedup": ratio(best["torch"], best["kernel"]),
                    "cpu_speedup": ratio(best_cpu["torch"], best_cpu["kernel"])}
                del calls
    return out


def _decode_step_times(engines: dict, prompts: list[list[int]], steps: int, rounds: int = 4) -> dict:
    """Per engine: the median decode step's (wall, this thread's CPU) seconds, their steps alternating in `rounds`
    rounds. At one thread the step runs on this thread alone, so its CPU time leaves out what a loaded host's other
    processes take of the core."""
    from inference.engine import SamplingParams

    params = SamplingParams(max_tokens=steps + 4, ignore_eos=True)
    for name, engine in engines.items():
        for i, prompt in enumerate(prompts):
            engine.add_request(f"{name}-{i}", prompt, params)
        started: set[str] = set()
        while len(started) < len(prompts):  # prefill (and a first token for every sequence)
            started |= {out.request_id for out in engine.step()}
        engine.step()  # one untimed decode step
    walls: dict[str, list[float]] = {name: [] for name in engines}
    cpus: dict[str, list[float]] = {name: [] for name in engines}
    per_round = math.ceil(steps / rounds)
    for _ in range(rounds):
        for name, engine in engines.items():
            for _ in range(per_round):
                start, cpu = time.perf_counter(), time.thread_time()
                engine.step()
                cpus[name].append(time.thread_time() - cpu)
                walls[name].append(time.perf_counter() - start)
    for engine in engines.values():
        while engine.has_unfinished():
            engine.step()
    return {name: (statistics.median(walls[name]), statistics.median(cpus[name])) for name in engines}


def engine_section(args) -> dict:
    from inference.engine import Config, LLMEngine

    path = model_dir(args.model)
    engines = {}
    narrow = [kv for kv in args.kv_cache_dtypes.split(",") if kv]
    for name in ("kernel", "torch_attention", *(f"kernel_kv_{kv}" for kv in narrow)):
        kv = name.removeprefix("kernel_kv_") if name.startswith("kernel_kv_") else "auto"
        engine = LLMEngine(Config(model=path, dtype=args.engine_dtype, threads=args.threads, prefix_caching=False,
                                  kv_cache_bytes=512 << 20, max_num_seqs=16, kv_cache_dtype=kv))
        if name == "torch_attention":  # the same engine, torch's gather and SDPA for the decode attention
            engine.model_runner.plan = replace(engine.model_runner.plan, paged_attention=None)
        engines[name] = engine
    info = engines["kernel"].matvec["decode_attention"]
    vocab = engines["kernel"].model_runner.vocab_size
    out: dict = {"model": str(path), "dtype": args.engine_dtype, "decode_attention": info, "cases": {}}
    cases = {f"1x{args.long_context}": random_prompts(1, args.long_context, vocab, seed=1),
             f"16x{args.batch_context}": random_prompts(16, args.batch_context, vocab, seed=2)}
    for case, prompts in cases.items():
        median = _decode_step_times(engines, prompts, args.steps)
        wall = {name: m[0] for name, m in median.items()}
        cpu = {name: m[1] for name, m in median.items()}
        out["cases"][case] = {**{f"{name}_step_ms": round(s * 1e3, 2) for name, s in wall.items()},
                              **{f"{name}_step_cpu_ms": round(s * 1e3, 2) for name, s in cpu.items()},
                              "cpu_saved_ms": round((cpu["torch_attention"] - cpu["kernel"]) * 1e3, 2),
                              "speedup": ratio(wall["torch_attention"], wall["kernel"]),
                              "cpu_speedup": ratio(cpu["torch_attention"], cpu["kernel"]),
                              **{f"kv_{kv}_cpu_speedup": ratio(cpu["kernel"], cpu[f"kernel_kv_{kv}"])
                                 for kv in narrow}}
    return out


def run(args) -> dict:
    return run_sections("decode_attention", args, {"calls": calls_section, "engine": engine_section})


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
