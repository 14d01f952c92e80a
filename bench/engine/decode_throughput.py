"""Decode throughput (generated tokens/s) of the engine vs three Hugging Face baselines, at several concurrencies.

Each request: a distinct `--prompt-tokens` random prompt, `--new-tokens` greedy tokens with ignore_eos. Throughput is
all generated tokens / wall time of the whole run (prefill included, for every method alike). The engine gets all
requests at once (`LLMEngine.generate`). HF generate runs one request at a time, so its rate does not depend on the
concurrency; it is measured on at most `--sequential-requests` requests to keep the run short. `generate_batch` is
transformers' continuous batching called as documented (a manager built per call: the reference figure the goals were
set against); `generate_batch_warm` reuses one persistent manager (see bench/lib/hf_baselines.py).

Every method runs in `--dtype` (the HF baselines load the model in it, the engine runs in it); `auto` is the model
config's own dtype, as a worker resolves it. `--vs-dtype` also times the engine in a second dtype in the same run
(`engine_<dtype>_tok_s`, `engine_vs_engine_<dtype>`): the speedup of bfloat16 over float32 is read from one run, on
one machine state, like every other ratio here. Goals are checked at `--goals-at` concurrent requests.

    python bench/engine/decode_throughput.py --model tiny --concurrency 1,8,32
    python bench/engine/decode_throughput.py --model smollm2 --dtype bfloat16 --vs-dtype float32 --concurrency 1,16 \
        --methods engine,static --goals-at 16
    python bench/engine/decode_throughput.py --model smollm2 --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import Timer, bootstrap, emit, environment, model_dir, random_prompts, ratio  # noqa: E402

METHODS = ("engine", "static", "hf_generate", "generate_batch", "generate_batch_warm")
BASELINES = METHODS[1:]
# One timed run is seconds for these (one-by-one generate; a cold generate_batch that is mostly setup); the others
# are best-of --repeats rounds (see timed_rounds), since on a shared machine the best run is the one least disturbed.
SINGLE_RUN = ("hf_generate", "generate_batch")
GOALS = {"engine_vs_static": 0.9, "engine_vs_hf_generate": 6.0, "engine_vs_generate_batch": 4.0}
# The engine in a 2-byte dtype against itself in float32 (--dtype bfloat16 --vs-dtype float32): half the bytes of
# weights and KV to move, so close to twice the speed where decode is bound by memory bandwidth.
HALF_VS_FLOAT32_GOAL = 1.8
DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=DTYPE_CHOICES,
                   help="of every method; auto: the model config's dtype")
    p.add_argument("--vs-dtype", default=None, choices=DTYPE_CHOICES,
                   help="also time the engine in this dtype (e.g. float32) and report the engine's speedup over it")
    p.add_argument("--goals-at", type=int, default=32, help="concurrency at which the goals are checked")
    p.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated numbers of concurrent requests")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--methods", default=",".join(METHODS), help=f"subset of {','.join(METHODS)}")
    p.add_argument("--sequential-requests", type=int, default=4, help="requests timed for hf_generate")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per method; the best is kept")
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    args.methods = [m for m in args.methods.split(",") if m]
    unknown = set(args.methods) - set(METHODS)
    if unknown or not args.concurrency or min(args.concurrency) < 1:
        p.error(f"bad --methods {sorted(unknown)} or --concurrency")
    return args


def resolve_dtype(requested: str, path: Path, device: str) -> str:
    """`auto` as a worker resolves it; float16 on a slow CPU is measured, not refused (a benchmark shows the cost)."""
    import torch

    from inference.engine.precision import resolve_dtype as engine_resolve

    return engine_resolve(requested, path, torch.device(device), allow_slow_float16=True)


def make_engine(path: Path, args, max_concurrency: int, dtype: str):
    """The engine sized for the largest batch: every sequence's KV fits, so nothing waits for blocks."""
    from transformers import AutoConfig

    from inference.engine import Config, LLMEngine

    cfg = AutoConfig.from_pretrained(path)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dtype_bytes = 4 if dtype == "float32" else 2
    bytes_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * dtype_bytes
    tokens = max_concurrency * (args.prompt_tokens + args.new_tokens + 32)
    config = Config(model=path, role="colocated", device=args.device, dtype=dtype, threads=args.threads,
                    allow_slow_float16=True,
                    kv_cache_bytes=max(64 << 20, int(1.25 * bytes_per_token * tokens)),
                    max_num_seqs=max(64, max_concurrency),
                    max_num_batched_tokens=max(2048, args.prompt_tokens))
    return LLMEngine(config)


def engine_runner(engine, num_new_tokens: int):
    from inference.engine import SamplingParams

    params = SamplingParams(max_tokens=num_new_tokens, temperature=0.0, ignore_eos=True)
    return lambda prompts: engine.generate(prompts, params)


def timed_rounds(runners: dict, batches: dict, device: str, repeats: int, errors: dict, where: str,
                 ) -> tuple[dict[str, float], dict[str, list[list[int]]]]:
    """Best seconds and outputs of each method, timed in rounds (every method once per round, SINGLE_RUN methods in
    the first only), so that a busy spell on a shared machine slows all methods alike instead of whichever ran then."""
    best: dict[str, float] = {}
    outputs: dict[str, list[list[int]]] = {}
    for round_index in range(repeats):
        for m, fn in runners.items():
            if (round_index and m in SINGLE_RUN) or f"{m}@{where}" in errors:
                continue
            try:
                with Timer(device) as t:
                    outputs[m] = fn(batches[m])
            except Exception as exc:
                errors[f"{m}@{where}"] = f"{type(exc).__name__}: {exc}"
                continue
            best[m] = min(best.get(m, float("inf")), t.seconds)
    return best, outputs


def run(args) -> dict:
    bootstrap(args.threads if args.device == "cpu" else None)
    from bench.lib import hf_baselines as hf

    path = model_dir(args.model)
    dtype = resolve_dtype(args.dtype, path, args.device)
    vs_dtype = resolve_dtype(args.vs_dtype, path, args.device) if args.vs_dtype else None
    model = hf.load_hf_model(path, args.device, dtype)
    vocab = model.config.vocab_size
    n = args.new_tokens
    runners = {"static": lambda ps: hf.static_batch_generate(model, ps, n),
               "hf_generate": lambda ps: hf.hf_generate_one_by_one(model, ps, n),
               "generate_batch": lambda ps: hf.hf_generate_batch(model, ps, n),
               "generate_batch_warm": lambda ps: hf.hf_generate_batch(model, ps, n, persistent=True)}
    errors: dict[str, str] = {}
    engines = {"engine": dtype}
    if vs_dtype is not None:
        engines[f"engine_{vs_dtype}"] = vs_dtype
    for name, engine_dtype in engines.items():
        if "engine" not in args.methods:
            break
        try:
            runners[name] = engine_runner(make_engine(path, args, max(args.concurrency), engine_dtype), n)
        except Exception as exc:  # the engine is optional here: baselines still tell the story
            errors[name] = f"{type(exc).__name__}: {exc}"
    methods = [m for m in (*args.methods, *list(engines)[1:]) if m in runners]

    warm = random_prompts(2, 16, vocab, seed=99)
    for m in list(methods):  # first calls pay for lazy init (thread pools, allocator); keep them out of the timings
        try:
            if m == "generate_batch_warm":  # its persistent manager is sized by the first call: the largest workload
                runners[m](random_prompts(max(args.concurrency), args.prompt_tokens, vocab, seed=98))
            elif m != "generate_batch":  # cold by definition
                runners[m](warm[:1] if m == "hf_generate" else warm)
        except Exception as exc:
            errors[f"{m}@warmup"] = f"{type(exc).__name__}: {exc}"
            methods.remove(m)

    results = {}
    for conc in args.concurrency:
        prompts = random_prompts(conc, args.prompt_tokens, vocab, seed=conc)
        row = {}
        batches = {m: prompts[:args.sequential_requests] if m == "hf_generate" else prompts for m in methods}
        best, outputs = timed_rounds({m: runners[m] for m in methods}, batches, args.device, args.repeats, errors,
                                     str(conc))
        for m, seconds in best.items():
            num_tokens = sum(len(o) for o in outputs[m])
            row[f"{m}_tok_s"] = round(num_tokens / seconds, 1)
            row[f"{m}_seconds"] = round(seconds, 3)
            if num_tokens != len(batches[m]) * n:
                errors[f"{m}@{conc}"] = f"generated {num_tokens} tokens, expected {len(batches[m]) * n}"
        for base in (*BASELINES, *list(engines)[1:]):
            row[f"engine_vs_{base}"] = ratio(row.get("engine_tok_s"), row.get(f"{base}_tok_s"))
        if "static" in outputs:  # greedy agreement with the plain batched forward (fp32: expect 1.0)
            for m in ("engine", *BASELINES[1:]):
                if m in outputs:
                    same = sum(a == b for a, b in zip(outputs[m], outputs["static"]))
                    row[f"{m}_matches_static"] = round(same / len(outputs[m]), 3)
        results[str(conc)] = row

    goals_for = dict(GOALS)
    if vs_dtype == "float32" and dtype in ("bfloat16", "float16"):
        goals_for["engine_vs_engine_float32"] = HALF_VS_FLOAT32_GOAL
    at = results.get(str(args.goals_at), {})
    goals = {f"{k}>={v}": (at[k] >= v if at.get(k) is not None else None) for k, v in goals_for.items()}
    return {"benchmark": "decode_throughput", "model": args.model, "model_path": str(path),
            "num_params": sum(p.numel() for p in model.parameters()), "device": args.device, "dtype": dtype,
            "dtype_requested": args.dtype, "vs_dtype": vs_dtype, "threads": args.threads,
            "prompt_tokens": args.prompt_tokens, "new_tokens": n, "sequential_requests": args.sequential_requests,
            "results": results, "goals_at": args.goals_at, "goals": goals, "errors": errors,
            "environment": environment()}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
