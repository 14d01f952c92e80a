"""The float32 engine with each decode lever alone against the same without it (stage_limits' `levers` section),
and the engine helpers both modules share.

Levers: `fused_projections` (q/k/v and gate/up as one matmul each), `prepacked_linears` (MKL's packed GEMM),
`compile` (torch.compile of the decode step, with its warm-up) on the reference forward, which they change;
`transposed_weights` (weight_layout "transposed" against "as_loaded") and `matvec` (Tandem's matrix-vector kernel,
"tandem" against "torch", each with the layout auto gives it) on the lean forward. Each with its greedy output checked
token for token against the engine without it.
"""
from __future__ import annotations

import gc
from pathlib import Path

from bench.engine.faster_tokens import decode_rates, greedy_agreement
from bench.lib.common import ratio

LEVERS = ("fused_projections", "prepacked_linears", "compile", "transposed_weights", "matvec")


# -- engines -----------------------------------------------------------------------------------------------------

def make_engine(path: Path, args, **settings):
    from inference.engine import Config, LLMEngine

    base = {"dtype": "float32", "threads": args.threads, "kv_cache_bytes": 256 << 20,
            "max_num_batched_tokens": max(2048, args.prompt_tokens), "prefix_caching": False}
    return LLMEngine(Config(model=path, **{**base, **settings}))


def engine_runner(engine):
    from inference.engine import SamplingParams

    return lambda prompts, n: engine.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True))


def release(*objects) -> None:
    del objects
    gc.collect()


def decode_step_ops(engine, prompt: list[int]) -> int:
    """Tensor ops (aten calls) of one single-stream decode step: the per-step overhead that no bandwidth removes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from inference.engine import SamplingParams

    class Count(TorchDispatchMode):
        num_ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.num_ops += 1
            return func(*args, **(kwargs or {}))

    engine.add_request("count-ops", prompt, SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.scheduler.waiting or any(seq.is_prefilling for seq in engine.scheduler.running):
        engine.step()
    with Count():
        engine.step()
    while engine.has_unfinished():
        engine.step()
    return Count.num_ops


# -- the section --------------------------------------------------------------------------------------------------

def lever_section(ctx: dict, args, lever: str) -> dict:
    """The float32 engine with one lever against the same without it: decode step and greedy tokens (and for
    compile its warm-up)."""
    from inference.engine import SamplingParams
    from inference.engine.fusion import fuse_projections, prepack_linears

    # On the reference forward, which the first three change (the lean decode forward fuses projections itself),
    # over the weights as loaded, with torch's matmul; transposed weights (the engine setting) on the engine's
    # default (lean) forward with torch's matmul (the kernel reads the weights as loaded); matvec on the lean forward,
    # each side with the layout auto gives it.
    lean = lever in ("transposed_weights", "matvec")
    if lever == "matvec":
        plain = make_engine(ctx["path"], args, matvec="torch")
        other = make_engine(ctx["path"], args, matvec="tandem")
    else:
        plain = make_engine(ctx["path"], args, lean_decode=lean, weight_layout="as_loaded", matvec="torch")
        other = make_engine(ctx["path"], args, compile=lever == "compile", lean_decode=lean, matvec="torch",
                            weight_layout="transposed" if lean else "as_loaded")
    if lever == "fused_projections":
        fuse_projections(other.model_runner.model)
    elif lever == "prepacked_linears":
        prepack_linears(other.model_runner.model)
    prompts = ctx["decode_prompts"]
    greedy = SamplingParams(max_tokens=args.new_tokens, temperature=0.0)
    agreement = greedy_agreement(plain.generate(prompts, greedy), other.generate(prompts, greedy))
    rates = decode_rates({"without": engine_runner(plain), "with": engine_runner(other)}, prompts[:1],
                         args.new_tokens, args.repeats)
    ctx["goals"][f"{lever}_greedy_token_identical"] = agreement["identical_prompts"] == len(prompts)
    out = {"dtype": "float32", "single_stream": rates,
           "speedup": ratio(rates["without"]["step_ms"], rates["with"]["step_ms"]), "greedy_agreement": agreement}
    if lever == "compile":
        out["compile_info"] = other.compile_info
    if lever == "matvec":
        out["matvec"] = {"without": plain.matvec, "with": other.matvec}
        out["weight_layout"] = {"without": plain.weight_layout["layout"], "with": other.weight_layout["layout"]}
    if lever in ("transposed_weights", "matvec"):
        read_ms = plain.weight_bytes / ctx["machine"]["read_bandwidth"]["read_bytes_per_s"] * 1e3
        out["step_vs_weights_read"] = {name: ratio(rates[name]["step_ms"], read_ms) for name in rates}
    else:
        out["step_ops"] = {"without": decode_step_ops(plain, prompts[0]), "with": decode_step_ops(other, prompts[0])}
    release(plain, other)
    return out
