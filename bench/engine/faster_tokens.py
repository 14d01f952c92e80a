"""Faster tokens: each speed-up of a single stream against the engine without it, measured in the same run.

One JSON document with:
- `machine`: this machine's memory bandwidth, measured here (a large float32 tensor summed: bytes read per second,
  and copied: bytes read + written per second), best of a few tries;
- `baseline`: SmolLM2 in float32, single-stream decode of Hugging Face `generate` and of the engine, one thread,
  and the time to read the float32 weights once at the measured read bandwidth;
- one section per speed-up, each with its own figures and goals: `int8` (INT8 weights, `quantization: int8`),
  `speculative` (speculative decoding, `speculative: {...}`, ngram and layers against the same float32 engine
  without it), `prefix_ttft` and `prefix_routing` (prefix caching and cache-aware routing, bench/lib/prefix_reuse.py);
- `goals`: every goal, met (true) or not (false), from the figures of this run.

Decode speed is read without the prefill: for each method, the time to generate N tokens minus the time to generate
1 (the prefill and the first token), over N - 1. Timings are best of `--repeats`, taken in rounds (each method once
per round) so that a busy spell on a shared machine slows all methods alike.

    python bench/engine/faster_tokens.py          # SmolLM2, one thread, every section
    python bench/engine/faster_tokens.py --sections int8 --new-tokens 32 --ppl-tokens 1024
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib import prefix_reuse  # noqa: E402
from bench.lib.common import ROOT, Timer, bootstrap, emit, environment, model_dir, ratio  # noqa: E402

DATA_DIR = ROOT / "bench" / "data"
# Public text shipped with the repo: the GNU Free Documentation License 1.3, as Debian ships it
# (/usr/share/common-licenses/GFDL-1.3; "everyone is permitted to copy and distribute verbatim copies").
PPL_TEXT = DATA_DIR / "gfdl-1.3.txt"
PROMPTS = DATA_DIR / "greedy_prompts.json"
# Written for this repository: passages to rewrite and code to edit (copy-heavy), and general chat questions.
SPEC_PROMPTS = DATA_DIR / "speculative_prompts.json"
# The speculative settings measured: name -> the revision setting.
SPEC_METHODS = {
    "ngram": {"method": "ngram", "num_tokens": 5},
    "layers8": {"method": "layers", "num_tokens": 3, "layers": 8},
    "layers16": {"method": "layers", "num_tokens": 3, "layers": 16},
}
GOALS = {
    "int8_single_stream_vs_hf_generate": 2.5,  # at least
    "int8_batch8_vs_fp32_engine": 1.5,  # at least
    "int8_perplexity_vs_fp32": 1.03,  # at most
    "int8_weight_bytes_vs_fp32": 0.3,  # at most
    "prefix_ttft_warm_vs_cold": 0.2,  # at most
    "prefix_routing_cache_aware_hit_rate": 0.8,  # at least
    **{f"speculative_{name}_copy_heavy_vs_plain": 1.8 for name in SPEC_METHODS},  # at least
    **{f"speculative_{name}_chat_vs_plain": 0.95 for name in SPEC_METHODS},  # at least
}
AT_MOST = {"int8_perplexity_vs_fp32", "int8_weight_bytes_vs_fp32", "prefix_ttft_warm_vs_cold"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a model folder")
    p.add_argument("--threads", type=int, default=1, help="torch threads (single-stream figures: 1, as the issue)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated: {', '.join(SECTIONS)}")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--ppl-tokens", type=int, default=2048, help="tokens of the text scored for perplexity")
    p.add_argument("--ppl-window", type=int, default=1024)
    p.add_argument("--agreement-tokens", type=int, default=32)
    p.add_argument("--spec-new-tokens", type=int, default=96,
                   help="speculative: the most tokens generated per prompt (greedy, until EOS)")
    args = p.parse_args(argv)
    args.sections = [s for s in args.sections.split(",") if s]
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        p.error(f"unknown --sections {sorted(unknown)}; known: {', '.join(SECTIONS)}")
    return args


# -- the machine -------------------------------------------------------------------------------------------------

def memory_bandwidth(num_bytes: int = 512 << 20, tries: int = 5) -> dict:
    """Bytes per second this process reads and copies (inference.roofline_measure, what node agents measure)."""
    from inference.roofline_measure import memory_bandwidth as measure

    return measure(num_bytes, tries)


# -- timing helpers ----------------------------------------------------------------------------------------------

def make_engine(path: Path, *, quantization: str, max_num_seqs: int, threads: int):
    from inference.engine import Config, LLMEngine

    return LLMEngine(Config(model=path, dtype="float32", quantization=quantization, threads=threads,
                            kv_cache_bytes=256 << 20, max_num_seqs=max(8, max_num_seqs)))


def engine_runner(engine):
    from inference.engine import SamplingParams

    return lambda prompts, n: engine.generate(prompts, SamplingParams(max_tokens=n, ignore_eos=True))


def hf_runner(model):
    from bench.lib import hf_baselines as hf

    return lambda prompts, n: hf.hf_generate_one_by_one(model, prompts, n)


def decode_rates(runners: dict, prompts: list[list[int]], num_new_tokens: int, repeats: int) -> dict:
    """Per method: decode tokens/s over all prompts, and seconds per decode step, without the prefill."""
    best_n: dict[str, float] = {}
    best_1: dict[str, float] = {}
    for _ in range(repeats):
        for name, run in runners.items():
            with Timer() as t1:
                run(prompts, 1)
            with Timer() as tn:
                outputs = run(prompts, num_new_tokens)
            assert all(len(o) == num_new_tokens for o in outputs), name
            best_1[name] = min(best_1.get(name, math.inf), t1.seconds)
            best_n[name] = min(best_n.get(name, math.inf), tn.seconds)
    rates = {}
    for name in runners:
        step_s = max(best_n[name] - best_1[name], 1e-9) / (num_new_tokens - 1)
        rates[name] = {"tok_s": round(len(prompts) / step_s, 1), "step_ms": round(step_s * 1e3, 2),
                       "seconds_with_prefill": round(best_n[name], 3)}
    return rates


# -- quality -----------------------------------------------------------------------------------------------------

def perplexity(model, token_ids: list[int], window: int) -> float:
    """exp(mean negative log-likelihood) over non-overlapping windows of the text (each scored from its start)."""
    import torch
    import torch.nn.functional as F

    nll, count = 0.0, 0
    with torch.inference_mode():
        for start in range(0, len(token_ids) - 1, window):
            chunk = torch.tensor([token_ids[start:start + window]])
            if chunk.shape[1] < 2:
                break
            logits = model(chunk).logits[0, :-1].float()
            nll += F.cross_entropy(logits, chunk[0, 1:], reduction="sum").item()
            count += chunk.shape[1] - 1
    return math.exp(nll / count)


def greedy_agreement(reference: list[list[int]], other: list[list[int]]) -> dict:
    """Tokens identical until the first divergence, as a share of all tokens, over the prompt set."""
    same = []
    for a, b in zip(reference, other):
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        same.append(n)
    total = sum(len(a) for a in reference)
    return {"share": round(sum(same) / total, 3), "identical_prompts": sum(n == len(a) for n, a in zip(same, reference)),
            "num_prompts": len(reference), "tokens_until_divergence": same}


# -- sections ----------------------------------------------------------------------------------------------------

def baseline_section(ctx: dict, args) -> dict:
    """HF generate and the engine, float32, single stream; the float32 weights read once at this machine's speed."""
    rates = decode_rates({"hf_generate": hf_runner(ctx["hf_model"]), "fp32_engine": engine_runner(ctx["fp32_engine"])},
                         ctx["prompts"][:1], args.new_tokens, args.repeats)
    weight_bytes = ctx["fp32_engine"].weight_bytes
    ctx["rates_single"] = rates
    return {"dtype": "float32", "single_stream": rates, "weight_bytes": weight_bytes,
            "weights_read_once_ms": round(weight_bytes / ctx["machine"]["read_bytes_per_s"] * 1e3, 2),
            "fp32_engine_step_vs_weights_read": ratio(rates["fp32_engine"]["step_ms"],
                                                      weight_bytes / ctx["machine"]["read_bytes_per_s"] * 1e3)}


def int8_section(ctx: dict, args) -> dict:
    """INT8 weights (quantization: int8) against the float32 engine and HF generate of this run."""
    import torch

    from inference.engine.quantization import quantize_model

    path, fp32 = ctx["path"], ctx["fp32_engine"]
    int8 = make_engine(path, quantization="int8", max_num_seqs=args.batch, threads=args.threads)
    read_bps = ctx["machine"]["read_bytes_per_s"]
    out: dict = {"weight_bytes": int8.weight_bytes, "fp32_weight_bytes": fp32.weight_bytes,
                 "weight_bytes_vs_fp32": round(int8.weight_bytes / fp32.weight_bytes, 4),
                 "weights_read_once_ms": round(int8.weight_bytes / read_bps * 1e3, 2)}

    single = decode_rates({"int8_engine": engine_runner(int8)}, ctx["prompts"][:1], args.new_tokens, args.repeats)
    base = ctx["rates_single"]
    out["single_stream"] = {**single, "vs_hf_generate": ratio(single["int8_engine"]["tok_s"],
                                                              base["hf_generate"]["tok_s"]),
                            "vs_fp32_engine": ratio(single["int8_engine"]["tok_s"], base["fp32_engine"]["tok_s"]),
                            "step_vs_weights_read": ratio(single["int8_engine"]["step_ms"],
                                                          out["weights_read_once_ms"])}
    batch = decode_rates({"fp32_engine": engine_runner(fp32), "int8_engine": engine_runner(int8)},
                         ctx["prompts"][:args.batch], args.new_tokens, args.repeats)
    out[f"batch{args.batch}"] = {**batch, "vs_fp32_engine": ratio(batch["int8_engine"]["tok_s"],
                                                                  batch["fp32_engine"]["tok_s"])}

    # Greedy agreement with the float32 engine over the fixed prompt set.
    tokenizer = int8.tokenizer
    texts = json.loads(PROMPTS.read_text())["prompts"]
    prompts = [tokenizer.encode(t) for t in texts]
    reference = engine_runner(fp32)(prompts, args.agreement_tokens)
    out["greedy_agreement"] = greedy_agreement(reference, engine_runner(int8)(prompts, args.agreement_tokens))
    del int8

    # Perplexity: Hugging Face's forward over the same int8 modules the engine runs (quantize_model; the engine
    # equals HF generate on that model token for token, tests/inference/engine/test_int8_greedy.py).
    ids = tokenizer.encode(PPL_TEXT.read_text())[:args.ppl_tokens]
    ppl_fp32 = perplexity(ctx["hf_model"], ids, args.ppl_window)
    from bench.lib.hf_baselines import load_hf_model

    quantized = load_hf_model(path, "cpu", "float32")
    quantize_model(quantized, kernel="fbgemm")
    ppl_int8 = perplexity(quantized, ids, args.ppl_window)
    out["perplexity"] = {"text": PPL_TEXT.name, "num_tokens": len(ids), "window": args.ppl_window,
                         "fp32": round(ppl_fp32, 3), "int8": round(ppl_int8, 3),
                         "int8_vs_fp32": round(ppl_int8 / ppl_fp32, 4)}
    del quantized
    torch.set_num_threads(args.threads)
    ctx["goals"].update({
        "int8_single_stream_vs_hf_generate": out["single_stream"]["vs_hf_generate"],
        "int8_batch8_vs_fp32_engine": out[f"batch{args.batch}"]["vs_fp32_engine"],
        "int8_perplexity_vs_fp32": out["perplexity"]["int8_vs_fp32"],
        "int8_weight_bytes_vs_fp32": out["weight_bytes_vs_fp32"],
    })
    return out


def speculative_section(ctx: dict, args) -> dict:
    """Speculative decoding (ngram; layers with two depths) against the float32 engine without it, single stream,
    greedy, on copy-heavy prompts and on general chat (SPEC_PROMPTS, in SmolLM2's chat template).

    Decode rate per method and workload: the tokens generated after the first, over the time to generate them
    (the time for the whole answer minus the time for its first token, which holds the prefill), summed over the
    workload's prompts; timed in rounds (each method once per round), best of --repeats. Greedy outputs must equal
    the plain engine's (`identical`)."""
    from inference.engine import Config, LLMEngine, SamplingParams

    path, plain = ctx["path"], ctx["fp32_engine"]
    engines = {"plain": plain}
    for name, spec in SPEC_METHODS.items():
        engines[name] = LLMEngine(Config(model=path, dtype="float32", threads=args.threads,
                                         kv_cache_bytes=256 << 20, speculative=spec))
    tokenizer = plain.tokenizer
    data = json.loads(SPEC_PROMPTS.read_text())
    out: dict = {"dtype": "float32", "threads": args.threads, "max_new_tokens": args.spec_new_tokens,
                 "prompts": SPEC_PROMPTS.name, "methods": SPEC_METHODS}

    def generate(engine, prompt, n):
        return engine.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0))[0]

    for workload in ("copy_heavy", "chat"):
        prompts = [tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                 tokenize=True, return_dict=False) for text in data[workload]]
        best: dict[tuple[str, int], float] = {}
        outputs: dict[tuple[str, int], list[int]] = {}
        for name, engine in engines.items():  # warm-up: lazy init, and each engine's first call
            generate(engine, prompts[0], 2)
        for _ in range(args.repeats):
            for i, prompt in enumerate(prompts):
                for name, engine in engines.items():
                    with Timer() as t1:
                        generate(engine, prompt, 1)
                    with Timer() as tn:
                        outputs[name, i] = generate(engine, prompt, args.spec_new_tokens)
                    best[name, i] = min(best.get((name, i), math.inf), max(tn.seconds - t1.seconds, 1e-9))
        section: dict = {}
        for name, engine in engines.items():
            num_tokens = sum(len(outputs[name, i]) - 1 for i in range(len(prompts)))
            seconds = sum(best[name, i] for i in range(len(prompts)))
            section[name] = {"decode_tok_s": round(num_tokens / seconds, 2), "tokens": num_tokens,
                             "decode_seconds": round(seconds, 2),
                             "identical": all(outputs[name, i] == outputs["plain", i] for i in range(len(prompts)))}
        for name in SPEC_METHODS:
            section[name]["vs_plain"] = ratio(section[name]["decode_tok_s"], section["plain"]["decode_tok_s"])
            ctx["goals"][f"speculative_{name}_{workload}_vs_plain"] = section[name]["vs_plain"]
        out[workload] = section
    for name in SPEC_METHODS:
        stats = engines[name].stats()
        proposed, accepted = stats["num_spec_proposed_tokens"], stats["num_spec_accepted_tokens"]
        out[f"{name}_acceptance"] = {"proposed": proposed, "accepted": accepted,
                                     "ratio": round(accepted / proposed, 3) if proposed else None}
    return out


# Each speed-up's section: name -> fn(ctx, args) -> dict.
SECTIONS = {"int8": int8_section, "speculative": speculative_section, "prefix_ttft": prefix_reuse.ttft_section,
            "prefix_routing": prefix_reuse.routing_section}


def run(args) -> dict:
    bootstrap(args.threads)
    from bench.lib.common import random_prompts
    from bench.lib.hf_baselines import load_hf_model

    path = model_dir(args.model)
    machine = memory_bandwidth()
    hf_model = load_hf_model(path, "cpu", "float32")
    fp32 = make_engine(path, quantization="none", max_num_seqs=args.batch, threads=args.threads)
    ctx = {"path": path, "machine": machine, "hf_model": hf_model, "fp32_engine": fp32, "goals": {},
           "prompts": random_prompts(args.batch, args.prompt_tokens, hf_model.config.vocab_size, seed=7)}
    for warm in (hf_runner(hf_model), engine_runner(fp32)):  # first calls pay for lazy init
        warm(ctx["prompts"][:1], 2)
    doc = {"benchmark": "faster_tokens", "model": args.model, "model_path": str(path), "threads": args.threads,
           "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "machine": machine,
           "baseline": baseline_section(ctx, args)}
    for name in args.sections:
        doc[name] = SECTIONS[name](ctx, args)
    doc["goals"] = {f"{k}{'<=' if k in AT_MOST else '>='}{GOALS[k]}": (
        None if value is None else (value <= GOALS[k] if k in AT_MOST else value >= GOALS[k]))
        for k, value in ctx["goals"].items()}
    doc["goal_values"] = ctx["goals"]
    doc["environment"] = environment()
    return doc


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
