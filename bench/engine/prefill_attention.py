"""Prefill attention on a CPU: Tandem's kernel (inference/engine/kernels/prefill_attention.c) against torch's path (SDPA's
flash kernel: causal over a whole prompt, and for a chunk after a cached prefix the prefix gathered from the cache
under a mask), in the same run.

- `calls`: one layer's attention at SmolLM2-135M's shapes (9 query / 3 KV heads, head dim 64), per dtype: whole
  prompts and chunks after a prefix, the keys at scattered rows of a pool as the cache holds them; kernel and torch
  interleaved over `--rounds`, the best kept; GFLOP/s counts the causal work (2 x 2 x D x query-key pairs).
- `engine`: the prefill of one prompt (time to the first token) through LLMEngine, with the kernel (`matvec` auto)
  and with it switched off in the same engine (torch's SDPA, everything else as is), alternating, best of
  `--rounds`; and greedy agreement of the two over `--agreement-prompts` prompts x 32 tokens (a 16-bit model's
  also each against the float32 engine's, where float32 ran first).

    python bench/engine/prefill_attention.py --threads 1
    python bench/engine/prefill_attention.py --threads 1 --sections engine --dtypes bfloat16 --prompt-tokens 1024
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import emit, model_dir, random_prompts, ratio, run_sections  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, SCALE = 9, 3, 64, 0.125  # SmolLM2-135M's
SECTIONS = ("calls", "engine")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--cases", default="256@0,1024@0,2048@0,256@768,256@1792,64@1984",
                   help="calls: chunk length @ position of its first query")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timed rounds, the best kept")
    p.add_argument("--model", default="smollm2", help="engine: tiny, smollm2 or a model folder")
    p.add_argument("--prompt-tokens", default="1024,2048", help="engine: prompt lengths")
    p.add_argument("--agreement-prompts", type=int, default=8, help="engine: prompts of 256 tokens for agreement")
    args = p.parse_args(argv)
    args.sections = [s for s in args.sections.split(",") if s]
    args.dtypes = [d for d in args.dtypes.split(",") if d]
    args.cases = [tuple(int(x) for x in c.split("@")) for c in args.cases.split(",") if c]
    args.prompt_tokens = [int(n) for n in args.prompt_tokens.split(",") if n]
    return args


def _call_pair(dtype, size: int, first: int, threads: int):
    """(kernel(), torch()) for one layer's chunk of `size` queries at position `first` over a scattered pool."""
    import torch
    import torch.nn.functional as F

    from inference.engine.kernels.prefill_attention import load_kernel

    library = load_kernel()[0]
    gen = torch.Generator().manual_seed(size + first)
    num_keys = first + size
    q = torch.randn(size, HEADS, HEAD_DIM, generator=gen).to(dtype)
    pool = [torch.randn(num_keys + 64, KV_HEADS, HEAD_DIM, generator=gen).to(dtype) for _ in range(2)]
    slots = torch.randperm(num_keys + 64, generator=gen)[:num_keys].contiguous()
    own_k, own_v = (p[slots] for p in pool)  # a whole prompt's own K/V, contiguous as the step's are
    out = torch.empty_like(q)
    mask = torch.zeros(size, num_keys, dtype=dtype).masked_fill_(
        ~torch.ones(size, num_keys, dtype=torch.bool).tril_(first), float("-inf"))
    q4 = q.transpose(0, 1).unsqueeze(0)
    if first == 0:
        own = torch.arange(size)

        def kernel():
            return library.attend(q, 0, own_k, own_v, own, SCALE, threads, out)

        def torchs():
            k4, v4 = (t.transpose(0, 1).unsqueeze(0) for t in (own_k, own_v))
            return F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=SCALE, enable_gqa=True)
    else:
        def kernel():
            return library.attend(q, first, pool[0], pool[1], slots, SCALE, threads, out)

        def torchs():  # as PrefillAttention._with_cached_prefix: a gather per KV head, the mask, SDPA
            k4, v4 = (p.index_select(0, slots).transpose(0, 1).unsqueeze(0) for p in pool)
            return F.scaled_dot_product_attention(q4, k4, v4, attn_mask=mask, scale=SCALE, enable_gqa=True)
    diff = (kernel().float() - torchs()[0].transpose(0, 1).float()).abs().max().item()
    assert diff <= (1e-4 if dtype == torch.float32 else 0.05), diff
    return kernel, torchs


def calls_section(args) -> dict:
    import torch

    from inference.engine.kernels.prefill_attention import load_kernel

    library, reason = load_kernel()
    if library is None:
        return {"skipped": reason}
    out: dict = {"isa": library.isa, "results": {}}
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        if not library.runs(dtype):
            out["results"][dtype_name] = {"skipped": "no AVX512-BF16"}
            continue
        for size, first in args.cases:
            calls = dict(zip(("kernel", "torch"), _call_pair(dtype, size, first, args.threads)))
            best = {name: math.inf for name in calls}
            for _ in range(args.rounds):
                for name, call in calls.items():
                    start = time.perf_counter()
                    call()
                    best[name] = min(best[name], time.perf_counter() - start)
            pairs = sum(first + i + 1 for i in range(size))  # query-key pairs a causal chunk computes
            flops = 4 * HEAD_DIM * HEADS * pairs
            out["results"][f"{dtype_name}/C{size}@{first}"] = {
                **{f"{name}_ms": round(s * 1e3, 3) for name, s in best.items()},
                **{f"{name}_gflop_s": round(flops / s / 1e9, 1) for name, s in best.items()},
                "speedup": ratio(best["torch"], best["kernel"])}
    return out


def _agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    same = [next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), len(p)) for p, q in zip(a, b)]
    return {"sequences_identical": sum(n == len(p) for n, p in zip(same, a)), "sequences": len(same),
            "mean_tokens_before_first_difference": round(sum(same) / len(same), 1)}


def engine_section(args) -> dict:
    from inference.engine import Config, LLMEngine, SamplingParams

    path = model_dir(args.model)
    out: dict = {"model": str(path), "results": {}}
    first_token = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    float32_tokens = None
    for dtype_name in args.dtypes:
        engine = LLMEngine(Config(model=path, dtype=dtype_name, threads=args.threads, prefix_caching=False,
                                  kv_cache_bytes=512 << 20))
        plan = engine.model_runner.plan
        kernel = plan.prefill_attention
        result: dict = {"prefill_attention": engine.matvec["prefill_attention"],
                        "prefill_chunk_size_alone": engine.config.prefill_chunk_size_alone}
        if kernel is None:
            out["results"][dtype_name] = result
            continue
        vocab = engine.model_runner.vocab_size
        engine.generate(random_prompts(1, 32, vocab, seed=9), first_token)  # lazy init
        for num_tokens in args.prompt_tokens:
            prompt = random_prompts(1, num_tokens, vocab, seed=num_tokens)
            best = {"kernel": math.inf, "torch": math.inf}
            for _ in range(args.rounds):
                for name in best:
                    engine.model_runner.plan = replace(plan, prefill_attention=kernel if name == "kernel" else None)
                    start = time.perf_counter()
                    engine.generate(prompt, first_token)
                    best[name] = min(best[name], time.perf_counter() - start)
            result[f"prompt_{num_tokens}"] = {**{f"{name}_s": round(s, 3) for name, s in best.items()},
                                              **{f"{name}_tok_s": round(num_tokens / s, 1) for name, s in best.items()},
                                              "speedup": ratio(best["torch"], best["kernel"])}
        prompts = random_prompts(args.agreement_prompts, 256, vocab, seed=3)
        greedy = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
        runs = {}
        for name in ("kernel", "torch"):
            engine.model_runner.plan = replace(plan, prefill_attention=kernel if name == "kernel" else None)
            runs[name] = engine.generate(prompts, greedy)
        result["greedy"] = _agreement(runs["kernel"], runs["torch"])
        if dtype_name == "float32":
            float32_tokens = runs["torch"]
        elif float32_tokens is not None:  # a 16-bit model's near-ties fall either way: each against float32's
            result["greedy_against_float32"] = {name: _agreement(tokens, float32_tokens)
                                                for name, tokens in runs.items()}
        out["results"][dtype_name] = result
        del engine
    return out


def run(args) -> dict:
    return run_sections("prefill_attention", args, {"calls": calls_section, "engine": engine_section})


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
