"""A compiled CUDA decode step with and without its batch padded to buckets (compilation.padded_batch_size), in one
engine and one run. One JSON.

Each distinct decode shape records a CUDA graph on first use, a stall of the step that meets it. A server's batch
changes size as requests come and go; unpadded, every size it meets (times log2 of the context) is a graph of its
own. The workload here is such a batch: `--requests` prompts whose max_tokens differ, so the running batch shrinks
through every size from `--requests` to 1. Per mode, a first pass (the shapes it meets for the first time) and a
second (all recorded), wall seconds; and the steady step at a bucket size and at one past a bucket (the padding's
cost), ms per step.

The two modes share one compiled engine (one warm-up): the padded mode runs first, so its first pass records only
the buckets' graphs; the unpadded first pass then records the other sizes only (the bucket sizes it meets are
recorded already), which understates its cost by those few sizes.

    python bench/engine/gpu_batch_buckets.py --random-from var/models/smollm2-135m --out bench/results/buckets.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.engine.gpu_stages import random_model  # noqa: E402
from bench.lib.common import bootstrap, random_prompts, ratio  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a model folder")
    p.add_argument("--random-from", help="a model folder whose config and tokenizer get random weights")
    p.add_argument("--work", default="/tmp/gpu-stages")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--steady-sizes", default="24,25", help="batch sizes of the steady step (a bucket, one past it)")
    p.add_argument("--out")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    bootstrap()
    import torch

    from inference.engine import Config, LLMEngine, SamplingParams

    if args.device == "cpu":  # a dry run of this script: inductor on the CPU, padding forced (no graphs to record)
        from inference.engine import model_runner
        model_runner.pads_decode_batch = lambda config, device: bool(config.compile)
    model_dir = (random_model(Path(args.random_from), Path(args.work) / (Path(args.random_from).name + "-random"))
                 if args.random_from else Path(args.model))
    start = time.perf_counter()
    engine = LLMEngine(Config(model=model_dir, device=args.device, dtype=args.dtype, compile=True,
                              kv_cache_bytes=2 << 30, prefix_caching=False, max_num_seqs=64))
    runner = engine.model_runner
    doc = {"model": str(model_dir), "dtype": args.dtype, "build_s": round(time.perf_counter() - start, 1),
           "compile": engine.compile_info, "modes": {}}
    scratch = runner.scratch_block
    if scratch is None:
        raise SystemExit("this engine pads no batch (compile on CUDA only): nothing to compare")
    shapes: set = set()
    forward = runner._compiled_decode_forward

    def counting(input_ids, positions, slot_mapping, attention):
        shapes.add((input_ids.shape[0], attention.block_tables.shape[1]))
        return forward(input_ids, positions, slot_mapping, attention)

    runner._compiled_decode_forward = counting
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    prompts = random_prompts(args.requests, args.prompt_tokens, vocab, seed=3)
    # Request i stops after 2i + 2 tokens: two steps at each batch size from `requests` down to 1.
    ragged = [SamplingParams(max_tokens=2 * i + 2, ignore_eos=True) for i in range(args.requests)]

    def timed(fn) -> float:
        if args.device != "cpu":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if args.device != "cpu":
            torch.cuda.synchronize()
        return time.perf_counter() - t

    outputs = {}
    for mode, pad in (("padded", True), ("unpadded", False)):
        runner.scratch_block = scratch if pad else None
        shapes.clear()
        row = {"first_pass_s": round(timed(lambda: outputs.setdefault(mode, engine.generate(prompts, ragged))), 3)}
        row["shapes_met"] = len(shapes)
        row["second_pass_s"] = round(timed(lambda: engine.generate(prompts, ragged)), 3)
        for size in [int(s) for s in args.steady_sizes.split(",")]:
            batch = prompts[:size]
            engine.generate(batch, SamplingParams(max_tokens=33, ignore_eos=True))  # its shapes recorded
            one = min(timed(lambda: engine.generate(batch, SamplingParams(max_tokens=1, ignore_eos=True)))
                      for _ in range(2))
            many = min(timed(lambda: engine.generate(batch, SamplingParams(max_tokens=33, ignore_eos=True)))
                       for _ in range(2))
            row[f"step_ms_at_{size}"] = round((many - one) / 32 * 1e3, 2)
        doc["modes"][mode] = row
        if args.out:
            Path(args.out).write_text(json.dumps(doc, indent=1))
    doc["same_tokens"] = outputs["padded"] == outputs["unpadded"]
    pad, unpad = doc["modes"]["padded"], doc["modes"]["unpadded"]
    doc["first_pass_unpadded_over_padded"] = ratio(unpad["first_pass_s"], pad["first_pass_s"])
    doc["second_pass_unpadded_over_padded"] = ratio(unpad["second_pass_s"], pad["second_pass_s"])
    doc["wall_s"] = round(time.perf_counter() - start, 1)
    if args.out:
        Path(args.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
