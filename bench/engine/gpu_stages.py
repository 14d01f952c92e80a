"""Each stage on a CUDA GPU (issue 19's GPU path): the engine's decode step eager and compiled (CUDA graphs), per dtype
and INT8, and its prefill against transformers' single forward, beside the device's measured peaks. One JSON.

- `machine`: the device, its compute capability, what `dtype: auto` resolves to for a bfloat16 model and why (the
  precision rule), the measured matmul peaks (bfloat16, float32 without TF32) and the device-to-device copy rate.
- `decode`: per variant (dtype x quantization x compile), decode tokens/s and ms per step at each concurrency
  (read without the prefill: N tokens minus 1 token, as faster_tokens.py), the build time and `compile_info`, and
  greedy agreement with the float32 eager engine of the same model (float32 compiled vs eager must be identical).
- `prefill`: one prompt of `--prefill-tokens` tokens, the engine's prefill (max_tokens 1) against transformers'
  forward of the same prompt in the same dtype; achieved FLOP/s (2 x parameters x tokens) over the matmul peak.

The model: `--model` (a folder), or `--random-from FOLDER`: that model's config and tokenizer with weights drawn at
random (seed 0, the config's initializer), saved in the config's dtype, for a host that has the architecture but
not the weights (a device machine reached only by a 64 MiB copy). Speed depends on shapes, not on weight values;
greedy agreement between dtypes on random weights says less than on trained ones (near-ties are common).

    python bench/engine/gpu_stages.py --model var/models/smollm2-135m
    python bench/engine/gpu_stages.py --random-from var/models/smollm2-135m --device cuda --budget-s 300
"""
from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.engine.faster_tokens import decode_rates, greedy_agreement  # noqa: E402
from bench.lib.common import Timer, bootstrap, random_prompts, ratio  # noqa: E402

# (name, dtype, quantization, compile): float32 eager first, the reference of every agreement.
# The order is the order of value where the budget cuts the run short.
VARIANTS = (("float32", "float32", None, False), ("bfloat16", "bfloat16", None, False),
            ("bfloat16+compile", "bfloat16", None, True), ("int8", "bfloat16", "int8", False),
            ("float32+compile", "float32", None, True))
LATE = {"float32+compile"}  # after the prefill section


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a model folder")
    p.add_argument("--random-from", help="a model folder whose config and tokenizer get random weights")
    p.add_argument("--work", default="/tmp/gpu-stages", help="where the random model is saved")
    p.add_argument("--device", default="cuda")
    p.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=600, help="variants not started after this many seconds skip")
    p.add_argument("--out", help="also write the JSON here after every section (a cut-off run keeps what it did)")
    return p.parse_args(argv)


def random_model(template: Path, dest: Path) -> Path:
    """The template's architecture and tokenizer with random weights, in the template config's dtype."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if (dest / "config.json").is_file():
        return dest
    config = AutoConfig.from_pretrained(template)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(config, "dtype", None) or torch.float32)
    dest.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dest)
    for path in template.iterdir():
        if path.is_file() and not path.name.endswith((".safetensors", ".bin", ".gguf")) and path.name != "config.json":
            shutil.copy(path, dest / path.name)
    return dest


def machine(device, model_dir: Path) -> dict:
    import torch

    from inference.engine.precision import choose_dtype

    info = {"device": str(device), "torch": torch.__version__}
    if device.type == "cuda":
        info["name"] = torch.cuda.get_device_name(device)
        info["capability"] = list(torch.cuda.get_device_capability(device))
    choice = choose_dtype("auto", model_dir, device)
    info["auto_dtype"] = {"model_config_dtype": json.loads((model_dir / "config.json").read_text()).get("dtype"),
                          "resolved": choice.name, "reason": choice.reason}
    size = 8192 if device.type == "cuda" else 1024
    for dtype in ("bfloat16", "float32"):
        a, b = (torch.randn(size, size, device=device, dtype=getattr(torch, dtype)) for _ in range(2))
        torch.matmul(a, b)
        with Timer(device.type) as t:
            for _ in range(5):
                torch.matmul(a, b)
        info[f"matmul_{dtype}_tflop_s"] = round(5 * 2 * size ** 3 / t.seconds / 1e12, 4)
        del a, b
    src = torch.randn(1 << 28 if device.type == "cuda" else 1 << 24, device=device)  # 1 GiB on CUDA
    dst = torch.empty_like(src)
    dst.copy_(src)
    with Timer(device.type) as t:
        for _ in range(5):
            dst.copy_(src)
    info["copy_read_plus_write_gb_s"] = round(5 * 2 * src.numel() * 4 / t.seconds / 1e9, 1)
    del src, dst
    return info


def make_engine(model_dir: Path, args, dtype: str, quantization: str | None, compile_: bool):
    from inference.engine import Config, LLMEngine

    settings = {"model": model_dir, "device": args.device, "dtype": dtype, "compile": compile_,
                "kv_cache_bytes": 2 << 30, "prefix_caching": False, "max_num_seqs": 64,
                "max_num_batched_tokens": max(2048, args.prefill_tokens)}
    if quantization:
        settings["quantization"] = quantization
    return LLMEngine(Config(**settings))


def decode_variant(model_dir: Path, args, variant, prompts: list[list[int]], reference: dict) -> dict:
    from inference.engine import SamplingParams

    name, dtype, quantization, compile_ = variant
    with Timer(args.device) as built:
        engine = make_engine(model_dir, args, dtype, quantization, compile_)
    row = {"dtype": dtype, "quantization": quantization, "compile": engine.compile_info,
           "build_s": round(built.seconds, 1), "weight_bytes": engine.weight_bytes, "by_concurrency": {}}
    run = lambda batch, n: engine.generate(batch, SamplingParams(max_tokens=n, ignore_eos=True))  # noqa: E731
    for conc in [int(c) for c in args.concurrency.split(",")]:
        rates = decode_rates({name: run}, prompts[:conc], args.new_tokens, args.repeats)[name]
        row["by_concurrency"][str(conc)] = rates
    greedy = run(prompts[:8], 32)
    if name == "float32":
        reference["tokens"] = greedy
    elif "tokens" in reference:
        row["greedy_vs_float32_eager"] = greedy_agreement(reference["tokens"], greedy)
    del engine
    gc.collect()
    _empty_cache()
    return row


def prefill_section(model_dir: Path, args, machine_info: dict) -> dict:
    """The engine's prefill of one long prompt against transformers' forward of it, per dtype."""
    import torch
    from transformers import AutoModelForCausalLM

    from inference.engine import SamplingParams

    prompt = random_prompts(1, args.prefill_tokens, json.loads((model_dir / "config.json").read_text())["vocab_size"],
                            seed=7)[0]
    out = {"prompt_tokens": args.prefill_tokens}
    for dtype in ("float32", "bfloat16"):
        engine = make_engine(model_dir, args, dtype, None, False)
        num_params = engine.weight_bytes // (4 if dtype == "float32" else 2)
        engine.generate([prompt], SamplingParams(max_tokens=1, ignore_eos=True))  # warm-up
        best = min(_timed(args.device, lambda: engine.generate([prompt], SamplingParams(max_tokens=1,
                                                                                          ignore_eos=True)))
                   for _ in range(3))
        del engine
        gc.collect()
        _empty_cache()
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(args.device).eval()
        ids = torch.tensor([prompt], device=args.device)
        with torch.inference_mode():
            hf(ids)
            hf_best = min(_timed(args.device, lambda: hf(ids)) for _ in range(3))
        del hf
        gc.collect()
        _empty_cache()
        flops = 2 * num_params * args.prefill_tokens
        peak = machine_info[f"matmul_{dtype}_tflop_s"] * 1e12
        out[dtype] = {"engine_s": round(best, 4), "transformers_forward_s": round(hf_best, 4),
                      "engine_tok_s": round(args.prefill_tokens / best), "engine_vs_transformers":
                      ratio(hf_best, best), "engine_share_of_matmul_peak": round(flops / best / peak, 3) if peak
                      else None}
    return out


def _timed(device: str, fn) -> float:
    with Timer(device) as t:
        fn()
    return t.seconds


def _empty_cache() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    args = parse_args(argv)
    bootstrap()
    import torch

    start = time.monotonic()
    if args.random_from:
        model_dir = random_model(Path(args.random_from), Path(args.work) / (Path(args.random_from).name + "-random"))
    elif args.model:
        model_dir = Path(args.model)
    else:
        raise SystemExit("--model or --random-from is required")
    doc: dict = {"model": str(model_dir), "random_weights": bool(args.random_from), "settings": vars(args),
                 "decode": {}, "skipped": [], "errors": {}}

    def save() -> None:
        if args.out:
            Path(args.out).write_text(json.dumps(doc, indent=1))

    doc["machine"] = machine(torch.device(args.device), model_dir)
    save()
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    prompts = random_prompts(max(int(c) for c in args.concurrency.split(",")), args.prompt_tokens, vocab)
    reference: dict = {}
    wanted = [v for v in VARIANTS if v[0] in args.variants.split(",")]

    def within_budget(name: str) -> bool:
        if time.monotonic() - start <= args.budget_s:
            return True
        doc["skipped"].append(name)
        return False

    # The prefill before the late variants: a cut-off run keeps what matters most.
    for variant in [v for v in wanted if v[0] not in LATE] + ["prefill"] + [v for v in wanted if v[0] in LATE]:
        name = variant if variant == "prefill" else variant[0]
        if not within_budget(name):
            continue
        try:
            if variant == "prefill":
                doc["prefill"] = prefill_section(model_dir, args, doc["machine"])
            else:
                doc["decode"][name] = decode_variant(model_dir, args, variant, prompts, reference)
        except Exception as exc:  # noqa: BLE001 - one part's failure is a figure too; the others still run
            doc["errors"][name] = f"{type(exc).__name__}: {str(exc)[:500]}"
        save()
    eager = doc["decode"].get("bfloat16", {}).get("by_concurrency", {})
    for name, row in doc["decode"].items():
        base = doc["decode"].get(name.split("+")[0], {}).get("by_concurrency", {})
        for conc, rates in row["by_concurrency"].items():
            if "+compile" in name and conc in base:
                rates["vs_eager_same_dtype"] = ratio(rates["tok_s"], base[conc]["tok_s"])
            if name == "int8" and conc in eager:
                rates["vs_bfloat16_eager"] = ratio(rates["tok_s"], eager[conc]["tok_s"])
    doc["wall_s"] = round(time.monotonic() - start, 1)
    save()
    print(json.dumps(doc, indent=1))
    return 1 if doc["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
