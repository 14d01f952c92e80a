"""A mixed step on a CPU: a few prompt tokens beside running decodes, its layers in one C call (decode_layers.c) against
the lean forward's ops, in the same run, with the pure decode step of the same streams beside them.

Under an ITL objective a step takes only the prompt tokens the objective leaves beside its decodes
(batch_limit.prefill_tokens: a few, at least 8 where the batch fills the objective), so a resumed stream's or a long
prompt's chunks ride many steps; each is a gap every stream waits out. The engine (SmolLM2, float32 unless told)
prefills `--streams` prompts, then one prompt waits; the scheduler's step of `--streams` decodes beside a chunk of N
prompt tokens (each of `--prompt-tokens`) is run again and again through the runner (the same rows, the same K/V
slots written each time), alternating the fused layers (`fused`) and the lean forward (`lean`, what every mixed step
ran before) step by step, with the pure decode step of the same streams (`decode`) and of N more streams
(`decode_more`: what batch_limit.prefill_tokens prices the mixed step at, a prompt token as a stream) between; the
median of each is kept, and the tokens each path samples in the step are compared.

    python bench/engine/mixed_step.py --threads 1
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import emit, model_dir, random_prompts, ratio, run_sections  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", default="smollm2", help="tiny, smollm2 or a model folder")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--streams", type=int, default=20, help="running decodes beside the prompt tokens")
    p.add_argument("--context", type=int, default=128, help="each stream's prompt tokens")
    p.add_argument("--prompt-tokens", default="4,8", help="prompt tokens beside the decodes, one case each")
    p.add_argument("--rounds", type=int, default=30, help="timed steps of each kind per case, interleaved")
    args = p.parse_args(argv)
    args.sections = ["mixed"]
    args.prompt_tokens = [int(n) for n in args.prompt_tokens.split(",") if n]
    return args


def _engine(args, num_prompt_tokens: int):
    from inference.engine import Config, LLMEngine

    # The chunk beside decodes counts the decodes' tokens too; the streams' prompts are prefilled in one step alone.
    num_streams = args.streams + num_prompt_tokens
    num_setup_tokens = num_streams * args.context
    return LLMEngine(Config(model=model_dir(args.model), dtype=args.dtype, threads=args.threads,
                            prefix_caching=False, kv_cache_bytes=256 << 20, max_num_seqs=num_streams + 1,
                            max_num_batched_tokens=num_setup_tokens, prefill_chunk_size_alone=num_setup_tokens,
                            prefill_chunk_size=num_streams + num_prompt_tokens))


def mixed_section(args) -> dict:
    import torch

    from inference.engine import SamplingParams

    out: dict = {"model": args.model, "dtype": args.dtype, "streams": args.streams, "context": args.context,
                 "cases": {}}
    for num_prompt_tokens in args.prompt_tokens:
        engine = _engine(args, num_prompt_tokens)
        runner, fused = engine.model_runner, engine.model_runner.lean_decoder.fused
        out["fused_decode"] = engine.matvec["fused_decode"]
        vocab = runner.vocab_size
        params = SamplingParams(max_tokens=512, ignore_eos=True)
        for i, prompt in enumerate(random_prompts(args.streams + num_prompt_tokens, args.context, vocab, seed=1)):
            engine.add_request(f"s{i}", prompt, params)
        while engine.scheduler.waiting or any(seq.is_prefilling for seq in engine.scheduler.running):
            engine.step()
        engine.add_request("p", random_prompts(1, 256, vocab, seed=2)[0], params)
        scheduled, is_prefill = engine.scheduler.schedule()  # every stream's decode slot, and the chunk
        more = [seq for seq in scheduled if not seq.is_prefilling]
        assert is_prefill and scheduled[0].num_scheduled_tokens == num_prompt_tokens
        decodes = more[:args.streams]
        seqs = [scheduled[0], *decodes]
        steps = {"fused": (seqs, True), "lean": (seqs, True), "decode": (decodes, False), "decode_more": (more, False)}
        times: dict[str, list[float]] = {name: [] for name in steps}
        tokens = {}
        for step in range(args.rounds + 2):  # the first two warm up
            for name, (batch, is_prefill) in steps.items():
                runner.lean_decoder.fused = None if name == "lean" else fused
                start = time.perf_counter()
                with torch.inference_mode():
                    result = runner.run(batch, is_prefill)
                if step >= 2:
                    times[name].append(time.perf_counter() - start)
                tokens.setdefault(name, result)
        runner.lean_decoder.fused = fused
        median = {name: statistics.median(values) for name, values in times.items()}
        out["cases"][f"{args.streams}+{num_prompt_tokens}"] = {
            **{f"{name}_step_ms": round(s * 1e3, 2) for name, s in median.items()},
            "fused_speedup": ratio(median["lean"], median["fused"]),
            "fused_over_decode": ratio(median["fused"], median["decode"]),
            "lean_over_decode": ratio(median["lean"], median["decode"]),
            "fused_over_decode_more": ratio(median["fused"], median["decode_more"]),
            "same_tokens": tokens["fused"] == tokens["lean"]}
    return out


def run(args) -> dict:
    return run_sections("mixed_step", args, {"mixed": mixed_section})


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
