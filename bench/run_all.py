"""Run every benchmark, each in its own process, and print one JSON document; it is also saved under bench/results/.

    python bench/run_all.py                         # CPU, float32; SmolLM2 at low concurrency only (CPU is slow)
    python bench/run_all.py --device cuda --dtype bfloat16
    python bench/run_all.py --only decode_tiny,gateway
    python bench/run_all.py --skip scrape_cycle,alert_to_action     # the data plane only

Each benchmark has a deadline; one that fails or runs out of time is reported with its stderr, and the rest still run.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.lib.common import RESULTS_DIR, ROOT, emit  # noqa: E402

BENCH = ROOT / "bench"


def plan(args) -> dict[str, list[str]]:
    """name -> script and arguments."""
    dev = ["--device", args.device, "--dtype", args.dtype]
    on_gpu = args.device.startswith("cuda")
    smol_decode = (["--concurrency", "1,8,32", "--repeats", "2"] if on_gpu else
                   # One CPU thread is slow on SmolLM2: the cold generate_batch and bs32 would take minutes.
                   ["--concurrency", "1,8", "--methods", "engine,static,hf_generate", "--sequential-requests", "1",
                    "--repeats", "1"])
    # SmolLM2's own dtype (bfloat16) against float32, engine and static loop in one run (minutes on one CPU thread).
    smol_dtype = ["--dtype", "bfloat16", "--vs-dtype", "float32", "--concurrency", "1,16", "--goals-at", "16",
                  "--methods", "engine,static", "--repeats", "1" if not on_gpu else "2"]
    return {
        "decode_tiny": ["engine/decode_throughput.py", "--model", "tiny", *dev],
        "decode_smollm2": ["engine/decode_throughput.py", "--model", "smollm2", *dev, *smol_decode],
        "decode_smollm2_bf16_vs_fp32": ["engine/decode_throughput.py", "--model", "smollm2", "--device", args.device,
                                        *smol_dtype],
        "kv_handoff_tiny": ["engine/kv_handoff.py", "--model", "tiny", *dev],
        "kv_handoff_smollm2": ["engine/kv_handoff.py", "--model", "smollm2", *dev, "--repeats", "3"],
        "gateway": ["gateway/gateway_overhead.py", "--model", "tiny", "--requests", "200"],
        "weighted_routing": ["gateway/weighted_routing.py", "--model", "tiny"],
        # Single-stream speed-ups on SmolLM2, CPU, one thread (minutes): int8 weights against float32 and HF generate.
        **({} if on_gpu else {"faster_tokens": ["engine/faster_tokens.py"]}),
        # Colocated, chunked and disaggregated on 2 threads each, SmolLM2 through the gateway (the longest on a CPU).
        "stage_split": ["engine/stage_split.py", "--model", "smollm2", "--threads", "2"],
        # The control plane's benchmarks (written with the control plane): no model, no device.
        "scrape_cycle": ["controlplane/scrape_cycle.py"],
        "alert_to_action": ["controlplane/alert_to_action.py", "--trials", "2"],
        "dashboard_page": ["controlplane/dashboard_page.py"],
    }


def run_one(script_args: list[str], timeout: float) -> tuple[dict | None, str | None, float]:
    started = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(BENCH / script_args[0]), *script_args[1:]], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f}s", time.monotonic() - started
    elapsed = time.monotonic() - started
    if proc.returncode != 0:
        return None, f"exit {proc.returncode}: {proc.stderr[-3000:]}", elapsed
    try:
        return json.loads(proc.stdout), None, elapsed
    except ValueError:
        return None, f"output is not JSON: {proc.stdout[-1000:]} {proc.stderr[-1000:]}", elapsed


def summary(results: dict) -> dict:
    """The headline figures and every goal, flattened: what a reader looks at first."""
    goals, figures = {}, {}
    for name, doc in results.items():
        if not isinstance(doc, dict):
            continue
        for key, ok in (doc.get("goals") or {}).items():
            goals[f"{name}.{key}"] = ok
        if name.startswith("decode"):
            for conc, row in doc.get("results", {}).items():
                for key in ("engine_tok_s", "static_tok_s", "engine_vs_static", "engine_vs_hf_generate",
                            "engine_vs_generate_batch", "engine_vs_generate_batch_warm", "engine_vs_engine_float32"):
                    if row.get(key) is not None:
                        figures[f"{name}@{conc}.{key}"] = row[key]
        elif name.startswith("kv_handoff"):
            figures[f"{name}.transfer_over_prefill"] = doc["in_process"]["transfer_over_prefill"]
            figures[f"{name}.bytes_over_ideal"] = doc["in_process"]["bytes_over_ideal"]
            if "workers" in doc:
                figures[f"{name}.worker_transfer_over_prefill"] = doc["workers"]["transfer_over_prefill"]
        elif name == "gateway":
            figures["gateway.added_p50_ms"] = doc["added_p50_ms"]
        elif name == "stage_split":
            for key, value in doc.get("ratios", {}).items():
                figures[f"stage_split.{key}"] = value
    return {"figures": figures, "goals": goals}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--only", default="", help="comma-separated subset of the benchmark names")
    p.add_argument("--skip", default="", help="comma-separated benchmark names to leave out")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per benchmark")
    args = p.parse_args(argv)
    todo = plan(args)
    only = [n for n in args.only.split(",") if n]
    skip = [n for n in args.skip.split(",") if n]
    if unknown := set(only + skip) - set(todo):
        p.error(f"unknown benchmarks {sorted(unknown)}; choose from {sorted(todo)}")
    results, errors, seconds = {}, {}, {}
    for name, script_args in todo.items():
        if (only and name not in only) or name in skip:
            continue
        print(f"[run_all] {name} ...", file=sys.stderr, flush=True)
        doc, error, elapsed = run_one(script_args, args.timeout)
        seconds[name] = round(elapsed, 1)
        if error:
            errors[name] = error
        else:
            results[name] = doc
    document = {"device": args.device, "dtype": args.dtype, "summary": summary(results), "results": results,
                "errors": errors, "seconds": seconds}
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"run_all-{args.device.replace(':', '')}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json"
    out.write_text(json.dumps(document, indent=2) + "\n")
    emit(document)
    print(f"[run_all] saved {out}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
