"""The peer, side by side: the engine against llama.cpp on the same model, the same prompts and the same threads, in
the same run.

llama.cpp runs through llama-cpp-python built from source in the bench's own venv (bench/.venv-peer, never in
pyproject.toml); `make bench-peer` creates it, builds it and runs this script. The model is converted to GGUF by
llama.cpp's own `convert_hf_to_gguf.py` (from the llama-cpp-python sdist, vendor/llama.cpp) where the files are not
there yet, with this venv's Python (the script needs torch and transformers, which the project venv has; it brings its
own gguf-py).

Each side runs in its own process (bench/engine/peer_llamacpp_side.py) that prints one JSON; `--rounds` alternate
the two sides so that a busy spell on a shared machine slows both alike, and each figure is the best over the rounds.
Figures per variant: prefill tokens/s (`--prompt-tokens`), single-stream decode tokens/s (`--new-tokens` greedy
tokens, without the time to the first), decode aggregate tokens/s at `--concurrency` requests (`--concurrent-prompt-
tokens` each; the engine's continuous batching against llama.cpp's parallel sequences in one context).

One JSON document: `engine` and `llama_cpp` (figures per variant), `ratios` (engine / llama.cpp at the same precision:
float32 vs F32, INT8 vs Q8_0, bfloat16 vs BF16 where both ran), `greedy_agreement` of the same pairs, `goals` (met or
not) with `goal_values`, and `machine` (CPU flags, threads, versions, the build time `make bench-peer` recorded).

    make bench-peer
    .venv/bin/python bench/engine/peer_llamacpp.py --rounds 1 --new-tokens 32
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench.lib.common import ROOT, bootstrap, emit, model_dir, random_prompts, ratio  # noqa: E402

SIDE = Path(__file__).resolve().parent / "peer_llamacpp_side.py"
PEER_VENV = ROOT / "bench" / ".venv-peer"
PEER_DIR = ROOT / "var" / "peer"
# engine variant -> Config dtype, quantization and matvec; llama.cpp variant -> convert_hf_to_gguf.py --outtype.
# "int8" is a colocated (or prefill) worker's INT8 as `auto` picks it here; "int8_decode_worker" what a decode worker
# runs by default, Tandem's int8 kernel (quantization.default_kernel; the same as "int8" on a CPU without VNNI).
ENGINE_VARIANTS = {"float32": ("float32", "none", "auto"), "int8": ("float32", "int8", "auto"),
                   "int8_decode_worker": ("float32", "int8", "tandem"), "bfloat16": ("bfloat16", "none", "auto"),
                   # with a float16 KV cache (Config.kv_cache_dtype), as llama.cpp keeps its own by default
                   "float32_kv16": ("float32", "none", "auto", "float16"),
                   "int8_decode_worker_kv16": ("float32", "int8", "tandem", "float16")}
LLAMA_VARIANTS = ("f32", "q8_0", "bf16")
# The same precision on both sides: engine variant -> llama.cpp variant.
PAIRS = {"float32": "f32", "int8": "q8_0", "int8_decode_worker": "q8_0", "bfloat16": "bf16", "float32_kv16": "f32",
         "int8_decode_worker_kv16": "q8_0"}
# engine / llama.cpp at the same precision, at least.
GOALS = {"prefill": 1.5, "single_decode": 1.0, "concurrent_decode": 3.0}
FIGURES = {"prefill": "prefill_tok_s", "single_decode": "single_decode_tok_s",
           "concurrent_decode": "concurrent_decode_tok_s"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2, tiny or a model folder")
    p.add_argument("--threads", type=int, default=1, help="threads of both sides")
    p.add_argument("--prompt-tokens", type=int, default=1024, help="the prefill and single-stream prompt")
    p.add_argument("--new-tokens", type=int, default=64, help="greedy tokens per request")
    p.add_argument("--concurrency", type=int, default=16, help="concurrent requests")
    p.add_argument("--concurrent-prompt-tokens", type=int, default=128, help="each concurrent request's prompt")
    p.add_argument("--rounds", type=int, default=2, help="rounds of both sides, alternated; best figure kept")
    p.add_argument("--repeats", type=int, default=1, help="timed runs of each figure within a side's round")
    p.add_argument("--engine-variants", default="float32,int8,int8_decode_worker,bfloat16",
                   help=f"of {', '.join(ENGINE_VARIANTS)}; bfloat16 runs only where the CPU computes it natively")
    p.add_argument("--llama-variants", default=None,
                   help=f"of {', '.join(LLAMA_VARIANTS)}; default f32,q8_0, and bf16 where the engine's bfloat16 runs")
    p.add_argument("--peer-python", default=str(PEER_VENV / "bin" / "python"), help="the venv with llama_cpp")
    p.add_argument("--llama-cpp-dir", default=None,
                   help="llama.cpp sources with convert_hf_to_gguf.py (default: var/peer/src/*/vendor/llama.cpp)")
    p.add_argument("--gguf-dir", default=str(PEER_DIR / "gguf"))
    p.add_argument("--n-batch", type=int, default=2048, help="llama.cpp n_batch (its own default)")
    p.add_argument("--n-ubatch", type=int, default=512, help="llama.cpp n_ubatch (its own default)")
    p.add_argument("--no-extra-bufts", action="store_true",
                   help="llama.cpp without its extra buffer types (weight repacking: AMX, AArch64), as llama-server's "
                        "--no-repack; its AMX Q8_0 path crashed (SIGSEGV) in 0.3.36 on an Intel Xeon with AMX")
    args = p.parse_args(argv)
    args.engine_variants = [v for v in args.engine_variants.split(",") if v]
    if args.llama_variants is None:
        from inference.hardware import cpu_has_native_bfloat16

        args.llama_variants = "f32,q8_0" + (",bf16" if "bfloat16" in args.engine_variants
                                            and cpu_has_native_bfloat16() else "")
    args.llama_variants = [v for v in args.llama_variants.split(",") if v]
    bad = (set(args.engine_variants) - set(ENGINE_VARIANTS)) | (set(args.llama_variants) - set(LLAMA_VARIANTS))
    if bad:
        p.error(f"unknown variants {sorted(bad)}")
    if args.new_tokens < 2 or min(args.threads, args.rounds, args.repeats, args.concurrency) < 1:
        p.error("--new-tokens must be at least 2; --threads, --rounds, --repeats, --concurrency at least 1")
    if not Path(args.peer_python).is_file():
        p.error(f"no llama.cpp venv at {args.peer_python}: run `make bench-peer` (it creates and builds it)")
    return args


# -- the model, converted ----------------------------------------------------------------------------------------

def find_llama_cpp_dir(given: str | None) -> Path:
    if given:
        path = Path(given)
    else:
        found = sorted((PEER_DIR / "src").glob("llama_cpp_python-*/vendor/llama.cpp"))
        if not found:
            raise SystemExit("no llama.cpp sources under var/peer/src: run `make bench-peer` or pass --llama-cpp-dir")
        path = found[-1]
    if not (path / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"--llama-cpp-dir {path} has no convert_hf_to_gguf.py")
    return path


def convert(path: Path, args) -> dict:
    """The GGUF file of each llama.cpp variant, converted from the model folder by llama.cpp's own script where it is
    not there yet (a file is named after the folder and the type, so another model gets its own)."""
    out_dir = Path(args.gguf_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files, script = {}, None
    for outtype in args.llama_variants:
        target = out_dir / f"{path.name}-{outtype}.gguf"
        if not target.is_file():
            script = script or find_llama_cpp_dir(args.llama_cpp_dir) / "convert_hf_to_gguf.py"
            tmp = target.with_suffix(".part")
            start = time.perf_counter()
            subprocess.run([sys.executable, str(script), str(path), "--outtype", outtype, "--outfile", str(tmp)],
                           check=True, stdout=sys.stderr)
            tmp.rename(target)
            print(f"converted {path} to {target} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
        files[outtype] = {"gguf": str(target), "file_bytes": target.stat().st_size}
    return files


# -- the two sides -----------------------------------------------------------------------------------------------

def run_side(python: str, side: str, spec: dict, threads: int, log: Path) -> dict:
    """One side's round in its own process; its log (llama.cpp's is long) goes to `log`, its JSON comes back."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        with log.open("w") as err:
            done = subprocess.run([python, str(SIDE), side, f.name], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=err, text=True, timeout=3600)
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-20:])
        raise SystemExit(f"the {side} side failed (exit {done.returncode}); the end of {log}:\n{tail}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def best_of_rounds(rounds: list[dict]) -> dict:
    """Per variant: the first round's settings, each rate at its best over the rounds (and the seconds at theirs)."""
    merged = json.loads(json.dumps(rounds[0]))
    for name, first in merged["variants"].items():
        for later in rounds[1:]:
            for key, value in later["variants"][name].items():
                if value is None or not key.endswith(("_s", "_ms")) or isinstance(value, bool):
                    continue
                if first[key] is None:
                    first[key] = value
                else:
                    first[key] = max(first[key], value) if key.endswith("tok_s") else min(first[key], value)
    return merged


def greedy_agreement(a: list[int], b: list[int]) -> dict:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return {"tokens_until_divergence": n, "of": len(a)}


# -- the machine -------------------------------------------------------------------------------------------------

def machine(args, llama: dict, engine: dict) -> dict:
    from inference.hardware import cpu_flags, cpu_has_native_bfloat16

    model_name = ""
    try:
        model_name = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                           if line.startswith("model name")), "")
    except OSError:
        pass
    build = PEER_DIR / "build_seconds"
    return {"cpu": model_name or platform.processor(),
            "cpu_flags": sorted(f for f in cpu_flags() if re.fullmatch(r"avx\w*|amx\w*|fma", f)),
            "native_bfloat16": cpu_has_native_bfloat16(), "cpu_count": os.cpu_count(), "threads": args.threads,
            "load_avg": os.getloadavg(), "python": platform.python_version(), "torch": engine["torch"],
            "transformers": engine["transformers"], "llama_cpp_python": llama["llama_cpp_python"],
            "llama_cpp_system_info": llama["system_info"],
            "llama_cpp_build_seconds": int(build.read_text()) if build.is_file() else None,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def run(args) -> dict:
    """1. Convert the model (where not yet); 2. the same prompts for both sides; 3. rounds of both sides;
    4. ratios, agreement and goals."""
    bootstrap(args.threads)
    from transformers import AutoConfig

    import torch

    from inference.engine.quantization import default_kernel
    from inference.hardware import cpu_has_native_bfloat16

    path = model_dir(args.model)
    ggufs = convert(path, args)
    vocab_size = AutoConfig.from_pretrained(path).vocab_size
    skipped = {}
    engine_variants = {}
    for name in args.engine_variants:
        if name == "bfloat16" and not cpu_has_native_bfloat16():
            skipped[name] = "this CPU has no native bfloat16 (avx512_bf16, amx_bf16 or Arm bf16)"
            continue
        if name == "int8_decode_worker" and default_kernel(torch.device("cpu"), "auto", role="colocated") == "matvec":
            skipped[name] = "the same kernel as int8 on this CPU (no VNNI: Tandem's int8 kernel for every role)"
            continue
        dtype, quantization, matvec, kv_cache_dtype = (*ENGINE_VARIANTS[name], "auto")[:4]
        engine_variants[name] = {"dtype": dtype, "quantization": quantization, "matvec": matvec,
                                 "kv_cache_dtype": kv_cache_dtype}
    common = {"threads": args.threads, "new_tokens": args.new_tokens, "repeats": args.repeats,
              "prompt": random_prompts(1, args.prompt_tokens, vocab_size, seed=11)[0],
              "concurrent_prompts": random_prompts(args.concurrency, args.concurrent_prompt_tokens, vocab_size,
                                                   seed=12)}
    engine_spec = {**common, "model_dir": str(path), "variants": engine_variants}
    llama_spec = {**common, "n_batch": args.n_batch, "n_ubatch": args.n_ubatch,
                  "extra_bufts": not args.no_extra_bufts,
                  "variants": {name: {"gguf": ggufs[name]["gguf"]} for name in args.llama_variants}}
    engine_rounds, llama_rounds = [], []
    for i in range(args.rounds):
        print(f"round {i + 1}/{args.rounds}: engine", file=sys.stderr)
        engine_rounds.append(run_side(sys.executable, "engine", engine_spec, args.threads,
                                      PEER_DIR / "logs" / f"engine-{i + 1}.log"))
        print(f"round {i + 1}/{args.rounds}: llama.cpp", file=sys.stderr)
        llama_rounds.append(run_side(args.peer_python, "llama", llama_spec, args.threads,
                                     PEER_DIR / "logs" / f"llama-{i + 1}.log"))
    engine, llama = best_of_rounds(engine_rounds), best_of_rounds(llama_rounds)

    ratios, agreement, goals, goal_values = {}, {}, {}, {}
    for ours, theirs in PAIRS.items():
        if ours not in engine["variants"] or theirs not in llama["variants"]:
            continue
        e, l = engine["variants"][ours], llama["variants"][theirs]
        pair = f"{ours}_vs_{theirs}"
        ratios[pair] = {figure: ratio(e[key], l[key]) for figure, key in FIGURES.items()}
        agreement[pair] = greedy_agreement(e["tokens"], l["tokens"])
        for figure, value in ratios[pair].items():
            goal_values[f"{pair}_{figure}"] = value
            goals[f"{pair}_{figure}>={GOALS[figure]}"] = None if value is None else value >= GOALS[figure]
    for side in (engine, llama):
        for figures in side["variants"].values():
            figures.pop("tokens")
    for name, figures in llama["variants"].items():
        figures["file_bytes"] = ggufs[name]["file_bytes"]
    return {"benchmark": "peer_llamacpp", "model": args.model, "model_path": str(path), "threads": args.threads,
            "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "concurrency": args.concurrency,
            "concurrent_prompt_tokens": args.concurrent_prompt_tokens, "rounds": args.rounds,
            "repeats": args.repeats,
            "concurrent_mode": {"engine": "continuous batching (LLMEngine.generate, all requests at once)",
                                "llama_cpp": "parallel sequences in one context (n_seq_max = concurrency), one "
                                             "llama_decode per step with one token per sequence"},
            "engine": {"variants": engine["variants"], "skipped": skipped},
            "llama_cpp": {"variants": llama["variants"], "converted_by": "convert_hf_to_gguf.py (llama.cpp's own)",
                          "extra_bufts": not args.no_extra_bufts},
            "ratios": ratios, "greedy_agreement": agreement, "goals": goals, "goal_values": goal_values,
            "machine": machine(args, llama, engine)}


def main(argv=None) -> int:
    emit(run(parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
