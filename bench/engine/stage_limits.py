"""Each stage against this machine's limit: prefill against the matmul peak, decode against the memory bandwidth.

One JSON document with:
- `machine`: CPU flags (inference/hardware.py), threads, the measured matmul peak per dtype (float32, bfloat16 with
  whether this CPU computes it natively, int8 through torch._int_mm and fbgemm's dynamic linear, the kernels the
  engine's INT8 uses) and the read bandwidth (a large float32 tensor summed);
- `prefill`: SmolLM2, a 2,048-token prompt: the engine in one pass against transformers' single forward of the same
  prompt (same dtype, same threads; transformers computes the last position's logits only, as the engine does),
  prompt tokens/s, their ratio, and achieved FLOP/s (2 x parameters x tokens) as a share of the matmul peak; the
  engine's prefill through its lean forward (the default) against the reference forward (`lean_prefill=False`); and
  chunked prefill against the one pass, with the engine's default chunks (64 tokens beside decodes, 256 in a step
  without any on a CPU) and with the fixed chunk of 64 in every step (`prefill_chunk_size_alone` = the chunk), and
  for both the time to first token of a short prompt that arrives just after the long one's first step started (it
  waits for that chunk, then runs in a step of its own);
- `decode`: per precision (float32, bfloat16 where native, INT8 as a colocated worker's `auto` picks it, and
  `int8_kernel`: Tandem's int8 kernel, a decode worker's), the engine's lean decode forward (its default, with
  Tandem's matvec kernel where `auto` takes it, and its layers in one C call where the kernels run them all:
  decode_layers.c) against the same with the layer loop in Python (`fused_decode=False`), with torch's matmul
  (`matvec=torch`; not for INT8, whose linears have their own kernels) and against its reference forward
  (`lean_decode=False`, torch's matmul; not for int8_kernel) in the same run: single-stream step time against the
  time to read its weights once at the measured bandwidth, tensor ops per step (the kernel's calls are not tensor
  ops), tokens/s at 16 concurrent requests, and the greedy agreement of the kernel with torch's matmul; INT8 against
  float32;
- `levers`: each decode lever alone against the float32 engine without it, both on the reference forward (which the
  levers change), with its greedy output checked token for token: `fused_projections` (q/k/v and gate/up as one
  matmul each; the lean forward always runs them fused), `prepacked_linears` (MKL's packed GEMM), `compile` (the
  engine setting: torch.compile of the decode step, with its warm-up); and on the lean forward
  `transposed_weights` (the engine setting weight_layout, "transposed" against "as_loaded": float32 weights fused
  and stored [in, out], faster reads, another summation order; auto's choice for float32 on a CPU), with both
  steps against one read of the weights; and `matvec` (the engine setting: Tandem's matrix-vector kernel, "tandem"
  against "torch" with the weight layout each gets from auto: as loaded with the kernel, transposed without it in
  float32; the before and after of the default);
- `goals`: each goal of the issue, met (true) or not (false), with the value it was judged on.

Timings are best of `--repeats` after one untimed pass of each (prefill also in this thread's CPU time, which a
busy host inflates less); decode steps are read without the prefill (N tokens minus 1 token, over N - 1).

    python bench/engine/stage_limits.py            # SmolLM2, 1 thread
    python bench/engine/stage_limits.py --quick    # fewer tokens and repeats
    python bench/engine/stage_limits.py --sections decode --levers ""   # the decode section alone
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.engine.faster_tokens import decode_rates, greedy_agreement, memory_bandwidth  # noqa: E402
from bench.engine.stage_levers import (LEVERS, decode_step_ops, engine_runner, lever_section, make_engine,  # noqa: E402
                                       release)
from bench.lib.common import (Timer, bootstrap, cpu_flags_of_interest, emit, environment, model_dir,  # noqa: E402
                              random_prompts, ratio)

# (at least | at most, bound) per goal of the issue.
GOALS = {
    "prefill_engine_vs_transformers": (">=", 1.0),
    "prefill_share_of_matmul_peak": (">=", 0.5),
    "chunked_prefill_overhead": ("<=", 0.10),
    "decode_float32_step_vs_weights_read": ("<=", 1.5),
    "decode_bfloat16_step_vs_weights_read": ("<=", 1.5),
    "decode_int8_step_vs_weights_read": ("<=", 1.5),
    "decode_int8_vs_float32": (">=", 2.0),
    # a decode worker's INT8 (Tandem's int8 kernel), where it differs from a colocated worker's (fbgemm with VNNI)
    "decode_int8_kernel_step_vs_weights_read": ("<=", 1.5),
    "decode_int8_kernel_vs_float32": (">=", 2.0),
    **{f"{lever}_greedy_token_identical": ("==", True) for lever in LEVERS},
}
CONCURRENT = 16  # requests of the decode section's batched figure
# The matmul of the issue's table: a 2,048-token prompt through SmolLM2's MLP up projection (576 -> 1536).
MATMUL_SHAPE = (2048, 576, 1536)
SHORT_PROMPT_TOKENS = 32  # the prompt that arrives behind the long one (chunked prefill's time to first token)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a model folder")
    p.add_argument("--threads", type=int, default=1, help="torch threads for every side (default 1)")
    p.add_argument("--quick", action="store_true", help="fewer decode tokens, one repeat, a shorter prompt")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed rounds, the best kept (default 2, 1 with --quick; more on a busy machine)")
    p.add_argument("--sections", default="prefill,decode", help="comma-separated: prefill, decode")
    p.add_argument("--levers", default=",".join(LEVERS),
                   help=f"comma-separated, each measured alone: {', '.join(LEVERS)} (compile's warm-up takes "
                        "minutes on a busy CPU); empty for none")
    args = p.parse_args(argv)
    args.levers = [lever for lever in args.levers.split(",") if lever]
    args.sections = [section for section in args.sections.split(",") if section]
    unknown = set(args.levers) - set(LEVERS)
    if unknown:
        p.error(f"unknown --levers {sorted(unknown)}; known: {', '.join(LEVERS)}")
    args.prompt_tokens = 512 if args.quick else 2048
    args.decode_prompt_tokens = 32
    args.new_tokens = 12 if args.quick else 40
    args.repeats = args.repeats or (1 if args.quick else 2)
    return args


# -- the machine -------------------------------------------------------------------------------------------------

def matmul_peaks(repeats: int) -> dict:
    """GFLOP/s of one MATMUL_SHAPE matmul per dtype, best of a few (inference.roofline_measure, what node agents
    measure; here bfloat16 is measured even where it is not native, and torch._int_mm beside fbgemm's kernel)."""
    from inference.roofline_measure import matmul_gflops

    peaks = matmul_gflops(shape=MATMUL_SHAPE, tries=3 + 2 * repeats, bfloat16=True, int8_int_mm=True)
    peaks["int8_fbgemm_linear_dynamic"] = peaks.pop("int8")
    return {"shape_mkn": list(MATMUL_SHAPE), "gflops": peaks}


def has_native_bfloat16() -> bool:
    import torch

    from inference.engine.precision import has_native_bfloat16 as native

    return native(torch.device("cpu"))


# -- engines -----------------------------------------------------------------------------------------------------

def short_behind_long(engine, long_prompt: list[int], short_prompt: list[int]) -> tuple[float, float]:
    """(wall, this thread's CPU) seconds to the short prompt's first token when it arrives just after the long
    prompt's first step started: the worst moment, it waits for that whole step."""
    from inference.engine import SamplingParams

    params = SamplingParams(max_tokens=1, ignore_eos=True)
    engine.add_request("long", long_prompt, params)
    start_cpu, start = time.thread_time(), time.perf_counter()
    engine.step()
    engine.add_request("short", short_prompt, params)
    while not any(out.request_id == "short" for out in engine.step()):
        pass
    seconds = time.perf_counter() - start, time.thread_time() - start_cpu
    engine.abort("long")
    while engine.has_unfinished():
        engine.step()
    return seconds


def num_parameters(engine) -> int:
    """Parameters of the float model (tied embedding and lm_head once), read from its config-shaped modules."""
    model = engine.model_runner.model
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel()
    return total


# -- sections ----------------------------------------------------------------------------------------------------

def prefill_section(ctx: dict, args) -> dict:
    """The engine's prefill of one prompt in one pass and in chunks, and transformers' single forward of it."""
    import torch

    from bench.lib.hf_baselines import load_hf_model

    path, prompt = ctx["path"], ctx["long_prompt"]
    one_pass = make_engine(path, args, chunked_prefill=False)
    reference = make_engine(path, args, chunked_prefill=False, lean_prefill=False)  # the forward over HF's modules
    chunked = make_engine(path, args, chunked_prefill=True)  # the default chunks (64 and 256 alone on a CPU)
    chunk = chunked.config.prefill_chunk_size
    fixed = make_engine(path, args, chunked_prefill=True, prefill_chunk_size_alone=chunk)  # 64 in every step
    hf = load_hf_model(path, "cpu", "float32")
    ids = torch.tensor([prompt])

    def hf_forward():
        with torch.inference_mode():
            return hf(ids, use_cache=False, logits_to_keep=1).logits[0, -1].argmax().item()

    runs = {"engine_one_pass": lambda: engine_runner(one_pass)([prompt], 1)[0][0],
            "engine_chunked": lambda: engine_runner(chunked)([prompt], 1)[0][0],
            "engine_chunked_fixed_chunk": lambda: engine_runner(fixed)([prompt], 1)[0][0],
            "engine_one_pass_reference_forward": lambda: engine_runner(reference)([prompt], 1)[0][0],
            "transformers_forward": hf_forward}
    best: dict[str, float] = {}
    cpu: dict[str, float] = {}  # this thread's CPU time: what a busy host inflates least (1 thread: all the work)
    first: dict[str, int] = {}
    short = ctx["short_prompt"]
    ttft: dict[str, list[float]] = {}  # engine -> [wall, CPU] seconds, best of the rounds
    for run in runs.values():  # untimed: each one's first pass faults its activations' pages in (a large share
        run()                  # of a long prompt's time, in system time), which a serving worker pays once
    for _ in range(args.repeats):  # in rounds, so that a busy spell slows all alike
        for name, run in runs.items():
            start = time.thread_time()
            with Timer() as t:
                first[name] = run()
            best[name] = min(best.get(name, math.inf), t.seconds)
            cpu[name] = min(cpu.get(name, math.inf), time.thread_time() - start)
        for name, engine in (("chunked", chunked), ("chunked_fixed_chunk", fixed)):
            ttft[name] = [min(a, b) for a, b in zip(ttft.get(name, (math.inf,) * 2),
                                                    short_behind_long(engine, prompt, short))]
    num_params = num_parameters(one_pass)
    flops = 2 * num_params * len(prompt)
    peak = ctx["machine"]["matmul"]["gflops"]["float32"] * 1e9
    out = {"dtype": {"engine": one_pass.dtype, "transformers": str(hf.dtype).removeprefix("torch.")},
           "prompt_tokens": len(prompt),
           "chunk_tokens": {"chunked": {"beside_decodes": chunk, "alone": chunked.scheduler.step_token_budget_alone},
                            "chunked_fixed_chunk": {"beside_decodes": chunk, "alone": chunk}},
           "num_parameters": num_params, "flops_counted": flops,
           "seconds": {k: round(v, 3) for k, v in best.items()},
           "cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},
           "tokens_per_s": {k: round(len(prompt) / v, 1) for k, v in best.items()},
           "first_token_same": len(set(first.values())) == 1,
           "engine_vs_transformers": ratio(best["transformers_forward"], best["engine_one_pass"]),
           "lean_vs_reference_forward": ratio(best["engine_one_pass_reference_forward"], best["engine_one_pass"]),
           "engine_share_of_matmul_peak": round(flops / best["engine_one_pass"] / peak, 3),
           "transformers_share_of_matmul_peak": round(flops / best["transformers_forward"] / peak, 3),
           "chunked_overhead": round(best["engine_chunked"] / best["engine_one_pass"] - 1, 3),
           "chunked_fixed_chunk_overhead": round(best["engine_chunked_fixed_chunk"] / best["engine_one_pass"] - 1, 3),
           "short_prompt_ttft_s": {"prompt_tokens": len(short), "behind": "the long prompt's first step",
                                    **{name: round(wall, 3) for name, (wall, _) in ttft.items()},
                                    "cpu_seconds": {name: round(c, 3) for name, (_, c) in ttft.items()}},
           "by_cpu_time": {"engine_vs_transformers": ratio(cpu["transformers_forward"], cpu["engine_one_pass"]),
                           "lean_vs_reference_forward": ratio(cpu["engine_one_pass_reference_forward"],
                                                              cpu["engine_one_pass"]),
                           "chunked_overhead": round(cpu["engine_chunked"] / cpu["engine_one_pass"] - 1, 3),
                           "chunked_fixed_chunk_overhead": round(cpu["engine_chunked_fixed_chunk"]
                                                                 / cpu["engine_one_pass"] - 1, 3)}}
    ctx["goals"].update(prefill_engine_vs_transformers=out["engine_vs_transformers"],
                        prefill_share_of_matmul_peak=out["engine_share_of_matmul_peak"],
                        chunked_prefill_overhead=out["chunked_overhead"])
    release(one_pass, chunked, fixed, reference, hf)
    return out


def decode_section(ctx: dict, args) -> dict:
    """Decode per precision (float32, bfloat16 where native, INT8), the engine (its lean decode forward) against its
    reference forward (lean_decode=False) in the same run: single-stream step time against the time to read the
    weights once at the measured bandwidth, tensor ops per step, and tokens/s at CONCURRENT requests."""
    from inference.engine import SamplingParams

    read_bps = ctx["machine"]["read_bandwidth"]["read_bytes_per_s"]
    # int8: a colocated worker's INT8 as auto picks it here (fbgemm with VNNI, Tandem's int8 kernel without);
    # int8_kernel: a decode worker's, Tandem's int8 kernel (the same as int8 on a CPU without VNNI)
    precisions = {"float32": {"dtype": "float32"}, "int8": {"dtype": "float32", "quantization": "int8"},
                  "int8_kernel": {"dtype": "float32", "quantization": "int8", "matvec": "tandem"}}
    if has_native_bfloat16():
        precisions["bfloat16"] = {"dtype": "bfloat16"}
    # lean_unfused: the lean forward's layer loop in Python over the same kernels (fused_decode off), the lever
    # decode_layers.c measured alone
    paths = {"lean": {}, "lean_unfused": {"fused_decode": False}, "lean_torch_matvec": {"matvec": "torch"},
             "reference": {"lean_decode": False, "matvec": "torch"}}
    engines = {(name, path): make_engine(ctx["path"], args, **settings, **extra)
               for name, settings in precisions.items() for path, extra in paths.items()
               if not ((path == "lean_torch_matvec" or path == "reference" and "matvec" in settings)
                       and "quantization" in settings)}
    runners = {f"{name}/{path}": engine_runner(e) for (name, path), e in engines.items()}
    single, many = ctx["decode_prompts"][:1], ctx["concurrent_prompts"]
    for run in runners.values():  # first calls pay for lazy init
        run(single, 2)
    rates = decode_rates(runners, single, args.new_tokens, args.repeats)
    concurrent = decode_rates(runners, many, args.new_tokens, args.repeats)
    out: dict = {"prompt_tokens": len(single[0]), "new_tokens": args.new_tokens, "concurrent": len(many),
                 "bfloat16": "measured (native here)" if "bfloat16" in precisions else "left out: not native here"}
    for name in precisions:
        engine = engines[(name, "lean")]
        read_ms = engine.weight_bytes / read_bps * 1e3
        row = {"dtype": engine.dtype, "quantization": engine.quantization, "weight_bytes": engine.weight_bytes,
               "weights_read_once_ms": round(read_ms, 2)}
        row["matvec"] = engine.matvec
        for path in paths:
            if (name, path) not in engines:
                continue
            step = rates[f"{name}/{path}"]
            row[path] = {**step, "step_vs_weights_read": ratio(step["step_ms"], read_ms),
                         "step_ops": decode_step_ops(engines[(name, path)], single[0]),
                         f"tok_s_at_{len(many)}": concurrent[f"{name}/{path}"]["tok_s"]}
        if "reference" in row:
            row["lean_speedup"] = {"single_stream": ratio(row["reference"]["step_ms"], row["lean"]["step_ms"]),
                                   f"at_{len(many)}": ratio(row["lean"][f"tok_s_at_{len(many)}"],
                                                            row["reference"][f"tok_s_at_{len(many)}"])}
        row["fused_speedup"] = {"single_stream": ratio(row["lean_unfused"]["step_ms"], row["lean"]["step_ms"]),
                                f"at_{len(many)}": ratio(row["lean"][f"tok_s_at_{len(many)}"],
                                                         row["lean_unfused"][f"tok_s_at_{len(many)}"])}
        if (name, "lean_torch_matvec") in engines:
            row["matvec_speedup"] = ratio(row["lean_torch_matvec"]["step_ms"], row["lean"]["step_ms"])
            greedy = SamplingParams(max_tokens=args.new_tokens, temperature=0.0)
            row["matvec_greedy_agreement"] = greedy_agreement(
                engines[(name, "lean_torch_matvec")].generate(ctx["decode_prompts"], greedy),
                engine.generate(ctx["decode_prompts"], greedy))
        out[name] = row
        ctx["goals"][f"decode_{name}_step_vs_weights_read"] = row["lean"]["step_vs_weights_read"]
    out["int8_vs_float32"] = ratio(rates["float32/lean"]["step_ms"], rates["int8/lean"]["step_ms"])
    ctx["goals"]["decode_int8_vs_float32"] = out["int8_vs_float32"]
    out["int8_kernel_vs_float32"] = ratio(rates["float32/lean"]["step_ms"], rates["int8_kernel/lean"]["step_ms"])
    ctx["goals"]["decode_int8_kernel_vs_float32"] = out["int8_kernel_vs_float32"]
    release(*engines.values())
    return out


# -- the document ------------------------------------------------------------------------------------------------

def judge(goals: dict) -> dict:
    """{goal: {"value", "bound", "met"}}; met is None where the value was not measured."""
    out = {}
    for name, (op, bound) in GOALS.items():
        value = goals.get(name)
        met = None if value is None else {">=": lambda: value >= bound, "<=": lambda: value <= bound,
                                          "==": lambda: value == bound}[op]()
        out[name] = {"value": value, "bound": f"{op} {bound}", "met": met}
    return out


def run(args) -> dict:
    bootstrap(args.threads)
    import torch

    path = model_dir(args.model)
    machine = {"cpu_flags": cpu_flags_of_interest(), "native_bfloat16": has_native_bfloat16(),
               "threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
               "matmul": matmul_peaks(args.repeats), "read_bandwidth": memory_bandwidth()}
    from transformers import AutoConfig

    vocab_size = AutoConfig.from_pretrained(path).vocab_size
    ctx = {"path": path, "machine": machine, "goals": {},
           "long_prompt": random_prompts(1, args.prompt_tokens, vocab_size, seed=11)[0],
           "short_prompt": random_prompts(1, SHORT_PROMPT_TOKENS, vocab_size, seed=12)[0],
           "decode_prompts": random_prompts(4, args.decode_prompt_tokens, vocab_size, seed=7),
           "concurrent_prompts": random_prompts(CONCURRENT, args.decode_prompt_tokens, vocab_size, seed=13)}
    doc = {"benchmark": "stage_limits", "model": args.model, "model_path": str(path), "threads": args.threads,
           "quick": args.quick, "machine": machine, "levers": {}}
    if "prefill" in args.sections:
        doc["prefill"] = prefill_section(ctx, args)
    if "decode" in args.sections:
        doc["decode"] = decode_section(ctx, args)
    for lever in args.levers:
        doc["levers"][lever] = lever_section(ctx, args, lever)
    doc["goals"] = judge(ctx["goals"])
    doc["environment"] = environment()
    return doc


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
