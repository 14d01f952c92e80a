"""Batched decode: the matvec kernel's tiles against oneDNN's GEMM, in the engine.

A decode step of N sequences multiplies N tokens by every weight. Up to 4 tokens the engine runs Tandem's row-at-a-time
kernel (inference/engine/kernels/matvec.c), which streams the weights at the memory's rate; above, a step is bound by
arithmetic, and the engine ran oneDNN's GEMM (gemm.py). Now the kernel also takes steps of 5-32 tokens, in tiles of
rows x 4 tokens (3 rows with AVX2, 6 with AVX-512; `Library.max_tokens_for(dtype)`: 32; in bfloat16 every step in
tiles of the AVX512-BF16 dot product where the CPU has it, up to 8 tokens where it has AMX or computes bfloat16 without
those tiles), and those steps run their layers in one C call (decode_layers.c). This runs one engine (`--dtype`,
float32 by default) and times its decode step at each `--concurrency` with the kernel's steps as they are now
(`tiles`), capped at 4 tokens as before (`onednn`: the class's max_tokens_for patched for those rounds) and, in
bfloat16 on a CPU with AVX512-BF16, with those tiles off (`no_bf16_tiles`: the AVX-512F kernels up to 8 tokens, as
before them), and on a CPU with AMX too with those tiles up to 32 tokens as without AMX (`bf16_tiles_to_32`, against
oneDNN's AMX GEMM above 8), in interleaved rounds (best kept): the median of a round's `--new-tokens` - 1 decode
steps of the whole batch (engine.step() timed alone, after the prefill).

Also: the step's FLOPs (2 x parameters x tokens) over its time against a large GEMM's rate in the same dtype
measured in the same run (`gemm_peak_gflop_s`: torch's matmul of [2048, 576] x [576, 1536]), and whether the greedy
tokens of the two agree at each concurrency (the sums run in other orders, so they may part at a near-tie).

    python bench/engine/batched_decode.py                      # SmolLM2, 1 thread, concurrency 1,4,5,8,16,32,48
    python bench/engine/batched_decode.py --concurrency 8,16 --repeats 5
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import bootstrap, emit, environment, model_dir, random_prompts, ratio  # noqa: E402

VARIANTS = ("tiles", "onednn")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a model folder")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                   help="the engine's (bfloat16: oneDNN's GEMM is AMX's where the CPU has it)")
    p.add_argument("--concurrency", default="1,4,5,8,16,32,48", help="comma-separated numbers of sequences")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=17)
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds; the best of each is kept")
    args = p.parse_args(argv)
    try:
        args.concurrency = sorted({int(c) for c in args.concurrency.split(",")})
    except ValueError:
        p.error(f"--concurrency: comma-separated integers, not {args.concurrency!r}")
    if min(args.concurrency) < 1 or args.new_tokens < 2 or args.repeats < 1:
        p.error("--concurrency at least 1, --new-tokens at least 2, --repeats at least 1")
    return args


@contextlib.contextmanager
def without_bfloat16_tiles():
    """bfloat16 as before the AVX512-BF16 tiles: the AVX-512F kernels (bfloat16 widened, FMAs) up to 8 tokens,
    oneDNN's bfloat16 GEMM above."""
    from inference.engine.kernels import matvec

    library = matvec.load()[0]
    library.use_bfloat16_tiles(False)
    try:
        yield
    finally:
        library.use_bfloat16_tiles(True)


@contextlib.contextmanager
def bfloat16_tiles_to_32():
    """On a CPU with AMX: the AVX512-BF16 tiles up to WIDE_MAX_TOKENS (32), as on a CPU without AMX, instead of
    oneDNN's AMX GEMM above 8 tokens."""
    from inference.engine.kernels import matvec

    library = matvec.load()[0]
    amx, library.amx = library.amx, False
    try:
        yield
    finally:
        library.amx = amx


@contextlib.contextmanager
def capped_at_four_tokens():
    """The engine as it was before the tiles: the kernel for steps of at most MAX_TOKENS (4), oneDNN above."""
    from inference.engine.kernels import matvec

    wide = matvec.Library.max_tokens_for
    matvec.Library.max_tokens_for = lambda self, dtype: matvec.MAX_TOKENS
    try:
        yield
    finally:
        matvec.Library.max_tokens_for = wide


def gemm_peak_gflop_s(dtype: str, repeats: int = 5) -> float:
    import torch

    a, b = torch.randn(2048, 576).to(getattr(torch, dtype)), torch.randn(576, 1536).to(getattr(torch, dtype))
    a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * 2048 * 576 * 1536 / best / 1e9


def run(args) -> dict:
    bootstrap(args.threads)
    from bench.lib.common import cpu_flags_of_interest
    from inference.engine import Config, LLMEngine, SamplingParams

    # Every prompt of a batch prefilled in one step (no chunks), so that every decode step timed carries them all.
    engine = LLMEngine(Config(model=model_dir(args.model), dtype=args.dtype, threads=args.threads,
                              kv_cache_bytes=1 << 30, max_num_seqs=max(64, max(args.concurrency)),
                              max_num_batched_tokens=max(2048, max(args.concurrency) * args.prompt_tokens),
                              chunked_prefill=False, prefix_caching=False))
    vocab = engine.model_runner.model.config.vocab_size
    num_params = sum(p.numel() for p in engine.model_runner.model.parameters())
    prompts = {n: random_prompts(n, args.prompt_tokens, vocab, seed=n) for n in args.concurrency}

    counter = iter(range(10**9))

    def decode_steps(batch) -> tuple[float, list[list[int]]]:
        """The median of the decode steps of the whole batch (the prefill left out), and each sequence's greedy
        tokens."""
        params = SamplingParams(max_tokens=args.new_tokens, temperature=0.0, ignore_eos=True)
        ids = [f"b{next(counter)}" for _ in batch]
        for request_id, prompt in zip(ids, batch):
            engine.add_request(request_id, prompt, params)
        out: dict[str, list[int]] = {request_id: [] for request_id in ids}

        def step() -> None:
            for o in engine.step():
                out[o.request_id].extend(o.new_token_ids)

        while any(not tokens for tokens in out.values()):  # the prefill, in as many steps as its budget takes
            step()
        times = []
        while engine.has_unfinished():
            start = time.perf_counter()
            step()
            if engine.num_step_tokens == len(batch):  # a decode step of every sequence (not a last, empty one)
                times.append(time.perf_counter() - start)
        if not times:
            raise SystemExit(f"no decode step carried all {len(batch)} sequences (the KV pool has "
                             f"{engine.stats()['num_kv_blocks_total']} blocks of {engine.config.block_size} tokens): "
                             "lower --concurrency or --prompt-tokens")
        return statistics.median(times), [out[request_id] for request_id in ids]

    from inference.engine.kernels import matvec

    library = matvec.load()[0]
    bf16_tiles = args.dtype == "bfloat16" and library is not None and library.bfloat16_tiles
    variants = VARIANTS + (("no_bf16_tiles",) if bf16_tiles else ()) + (
        ("bf16_tiles_to_32",) if bf16_tiles and library.amx else ())
    contexts = {"tiles": contextlib.nullcontext, "onednn": capped_at_four_tokens,
                "no_bf16_tiles": without_bfloat16_tiles, "bf16_tiles_to_32": bfloat16_tiles_to_32}
    decode_steps(prompts[min(args.concurrency)])  # lazy init
    best: dict[str, dict[int, float]] = {v: {} for v in variants}
    tokens: dict[str, dict[int, list[list[int]]]] = {v: {} for v in variants}
    peaks = []
    for _ in range(args.repeats):
        peaks.append(gemm_peak_gflop_s(args.dtype))
        for n in args.concurrency:
            for variant in variants:
                with contexts[variant]():
                    step, out = decode_steps(prompts[n])
                best[variant][n] = min(best[variant].get(n, float("inf")), step)
                tokens[variant][n] = out
    peak = max(peaks)
    results = {}
    for n in args.concurrency:
        row = {}
        for variant in variants:
            step = best[variant][n]
            row[variant] = {"step_ms": round(step * 1e3, 2), "tok_s": round(n / step, 1),
                            "gflop_s": round(2 * num_params * n / step / 1e9, 1),
                            "of_gemm_peak": round(2 * num_params * n / step / 1e9 / peak, 3)}
        row["tiles_over_onednn_tok_s"] = ratio(row["tiles"]["tok_s"], row["onednn"]["tok_s"])
        row["greedy_identical_sequences"] = sum(a == b for a, b in zip(tokens["tiles"][n], tokens["onednn"][n]))
        if "no_bf16_tiles" in variants:
            row["tiles_over_no_bf16_tiles_tok_s"] = ratio(row["tiles"]["tok_s"], row["no_bf16_tiles"]["tok_s"])
            row["greedy_identical_sequences_no_bf16_tiles"] = sum(
                a == b for a, b in zip(tokens["tiles"][n], tokens["no_bf16_tiles"][n]))
        if "bf16_tiles_to_32" in variants:
            row["bf16_tiles_to_32_over_tiles_tok_s"] = ratio(row["bf16_tiles_to_32"]["tok_s"], row["tiles"]["tok_s"])
        results[n] = row
    import torch

    lib = library
    return {"benchmark": "batched_decode", "model": args.model, "dtype": args.dtype, "threads": args.threads,
            "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "parameters": num_params,
            "kernel_isa": lib.isa if lib else None,
            "kernel_max_tokens": lib.max_tokens_for(getattr(torch, args.dtype)) if lib else None,
            "matvec": engine.matvec, "gemm_peak_gflop_s": round(peak, 1), "results": results,
            "note": None if lib is not None and lib.max_tokens_for(getattr(torch, args.dtype)) > matvec.MAX_TOKENS else
            "the kernel runs no tiles here: both variants are the same",
            "cpu_flags": cpu_flags_of_interest(), "environment": environment()}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
