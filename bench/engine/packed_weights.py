"""Prepacked weights (the engine setting `packed_weights`, inference/engine/packed_weights.py) against the engine
without them, engine direct, in one run: batched decode steps at fixed numbers of streams and the time to first
token of a long prompt, per dtype.

Two engines of the same model, dtype and threads, alike but for the setting, each with the engine's defaults
(chunked prefill, its chunk sizes), prefix caching off:
- `decode`: at each `--streams` N, both engines hold the same N random prompts of `--prompt-tokens` tokens, prefilled
  first; then `--rounds` rounds, each of `--steps` decode steps of all N sequences on one engine, then on the other
  (the order alternating per round: A B, B A, ...), each step timed alone (engine.step()). Both engines are at the
  same positions in a round, so their attention costs alike. Per variant the best round's median step; per round
  the ratio of the two medians (a busy spell on a shared machine slows both rounds of a pair alike); and how many
  sequences' greedy tokens agree over all the steps.
- `prefill`: the time to first token of a `--prefill-tokens` prompt (a fresh random prompt each time: nothing
  cached), the two engines alternating, `--rounds` times each; the best and the per-pair ratios, the first tokens'
  agreement, and the prefill's FLOP/s (2 x non-embedding parameters x tokens over the time) against a large GEMM's
  rate measured in the same run (`gemm_peak_gflop_s`).
- the host: `lscpu`'s model name, family and model, the CPU flags the kernels depend on, the weight bytes of both
  engines (the packed one holds the float weights twice) and what `/info` says under `matvec`.

    python bench/engine/packed_weights.py        # SmolLM2, 1 thread, float32 then bfloat16, 16 and 64 streams
    python bench/engine/packed_weights.py --dtypes bfloat16 --rounds 5
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.engine.batched_decode import gemm_peak_gflop_s  # noqa: E402
from bench.lib.common import bootstrap, emit, environment, model_dir, random_prompts, ratio  # noqa: E402

VARIANTS = ("unpacked", "packed")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a model folder")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=("float32", "bfloat16"),
                   help="each measured in turn, its own two engines (bfloat16: oneDNN's GEMM is AMX's where the CPU "
                        "has it)")
    p.add_argument("--streams", default="16,64", help="comma-separated numbers of sequences")
    p.add_argument("--prompt-tokens", type=int, default=128, help="each decode stream's prompt")
    p.add_argument("--steps", type=int, default=8, help="decode steps timed per round and engine")
    p.add_argument("--prefill-tokens", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds per figure")
    args = p.parse_args(argv)
    try:
        args.streams = sorted({int(n) for n in args.streams.split(",") if n})
    except ValueError:
        p.error(f"--streams: comma-separated integers, not {args.streams!r}")
    if min(args.streams, default=1) < 1 or args.steps < 1 or args.rounds < 1 or args.prefill_tokens < 1:
        p.error("--streams, --steps, --rounds and --prefill-tokens at least 1")
    return args


def lscpu() -> dict:
    """lscpu's model name, family and model (no figure on one CPU stands for another)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {key: fields[name].strip() for key, name in (("model_name", "Model name"), ("family", "CPU family"),
                                                       ("model", "Model"), ("vendor", "Vendor ID")) if name in fields}


def decode_section(engines: dict, args, vocab: int) -> dict:
    from inference.engine import SamplingParams

    results = {}
    for n in args.streams:
        prompts = random_prompts(n, args.prompt_tokens, vocab, seed=n)
        # Streams prefilled early decode while the others' chunks run: none may end before the timed steps do.
        params = SamplingParams(max_tokens=engines["packed"].max_model_len - args.prompt_tokens, temperature=0.0,
                                ignore_eos=True)
        tokens = {}
        for variant, engine in engines.items():
            for i, prompt in enumerate(prompts):
                engine.add_request(f"d{n}-{i}", prompt, params)
            tokens[variant] = {f"d{n}-{i}": [] for i in range(n)}
            while any(not out for out in tokens[variant].values()):  # the prefill, in the engine's chunks
                for o in engine.step():
                    tokens[variant][o.request_id].extend(o.new_token_ids)
        medians = {variant: [] for variant in engines}
        for r in range(args.rounds):
            for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
                engine, times = engines[variant], []
                for _ in range(args.steps):
                    start = time.perf_counter()
                    outs = engine.step()
                    times.append(time.perf_counter() - start)
                    assert engine.num_step_tokens == n, "a decode step of every stream"
                    for o in outs:
                        tokens[variant][o.request_id].extend(o.new_token_ids)
                medians[variant].append(statistics.median(times))
        for engine in engines.values():
            for request_id in tokens["packed"]:
                engine.abort(request_id)
            engine.step()  # the aborts' outputs
            assert not engine.has_unfinished()
        best = {variant: min(values) for variant, values in medians.items()}
        row = {variant: {"step_ms": round(best[variant] * 1e3, 2), "tok_s": round(n / best[variant], 1),
                         "round_step_ms": [round(t * 1e3, 2) for t in medians[variant]]} for variant in engines}
        row["packed_over_unpacked_tok_s"] = ratio(best["unpacked"], best["packed"])
        row["round_ratios"] = [ratio(a, b) for a, b in zip(medians["unpacked"], medians["packed"])]
        row["greedy_identical_sequences"] = sum(tokens["unpacked"][key] == tokens["packed"][key]
                                                for key in tokens["unpacked"])
        row["num_sequences"] = n
        results[str(n)] = row
    return results


def prefill_section(engines: dict, args, vocab: int, num_layer_params: int, dtype: str) -> dict:
    from inference.engine import SamplingParams

    prompts = random_prompts(2 * args.rounds, args.prefill_tokens, vocab, seed=1024)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    engines["unpacked"].generate(prompts[:1], params)  # a first prefill of this length, untimed, on both
    engines["packed"].generate(prompts[:1], params)
    times = {variant: [] for variant in engines}
    first = {variant: [] for variant in engines}
    for r in range(args.rounds):
        for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
            prompt = prompts[r]  # the same prompt on both engines in a round
            start = time.perf_counter()
            first[variant].append(engines[variant].generate([prompt], params)[0])
            times[variant].append(time.perf_counter() - start)
    peak = gemm_peak_gflop_s(dtype)
    flop = 2 * num_layer_params * args.prefill_tokens
    out = {variant: {"ttft_s": round(min(times[variant]), 4), "rounds_s": [round(t, 4) for t in times[variant]],
                     "gflop_s": round(flop / min(times[variant]) / 1e9, 1),
                     "of_gemm_peak": round(flop / min(times[variant]) / 1e9 / peak, 3)} for variant in engines}
    out["packed_over_unpacked_speed"] = ratio(min(times["unpacked"]), min(times["packed"]))
    out["round_ratios"] = [ratio(a, b) for a, b in zip(times["unpacked"], times["packed"])]
    out["first_tokens_identical"] = sum(a == b for a, b in zip(first["unpacked"], first["packed"]))
    out["num_prompts"] = args.rounds
    out["gemm_peak_gflop_s"] = round(peak, 1)
    return out


def run_dtype(args, path: Path, dtype: str) -> dict:
    import gc

    from inference.engine import Config, LLMEngine

    max_streams = max(args.streams, default=1)
    engines = {variant: LLMEngine(Config(model=path, dtype=dtype, threads=args.threads, kv_cache_bytes=1 << 30,
                                         max_num_seqs=max(64, max_streams), prefix_caching=False,
                                         packed_weights=variant == "packed"))
               for variant in VARIANTS}
    model = engines["unpacked"].model_runner.model
    vocab = model.config.vocab_size
    num_layer_params = sum(p.numel() for p in model.model.layers.parameters())
    doc = {"weight_bytes": {variant: engine.weight_bytes for variant, engine in engines.items()},
           "matvec": {variant: engine.matvec for variant, engine in engines.items()},
           "decode": {"prompt_tokens": args.prompt_tokens, "steps_per_round": args.steps, "rounds": args.rounds,
                      "streams": decode_section(engines, args, vocab)},
           "prefill": {"prompt_tokens": args.prefill_tokens,
                       **prefill_section(engines, args, vocab, num_layer_params, dtype)}}
    del engines, model
    gc.collect()
    return doc


def run(args) -> dict:
    bootstrap(args.threads)
    path = model_dir(args.model)
    return {"benchmark": "packed_weights", "model": args.model, "threads": args.threads, "cpu": lscpu(),
            **{dtype: run_dtype(args, path, dtype) for dtype in args.dtypes}, "environment": environment()}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
