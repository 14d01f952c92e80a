#!/usr/bin/env bash
# The GPU path of each stage in one command on a CUDA host (at most 11 minutes; every step has a deadline):
#
#     bash bench/engine/gpu_stages.sh [OUT_DIR]    # PYTHON=... for another interpreter; SMOLLM2=folder
#
# 1. bench/engine/gpu_stages.py on SmolLM2's shapes: the real weights where $SMOLLM2 holds them (model.safetensors),
#    else its config and tokenizer with random weights (a host reached only by a small copy): decode eager and
#    compiled (CUDA graphs) per dtype and INT8, prefill against transformers, the matmul peaks and copy rate;
# 2. bench/engine/gpu_worker_check.py on the tiny model: real workers behind a gateway (dtype rule, NVML series,
#    float32 equal to the CPU's, compile, int8, KV auto sizing, the KV handoff and its dtype conversion).
# JSON in OUT_DIR (default bench/results): gpu_stages.json, gpu_worker_check.json, and their logs.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
OUT_DIR=${1:-bench/results}
SMOLLM2=${SMOLLM2:-var/models/smollm2-135m}
STAGES_S=${STAGES_S:-420}
mkdir -p "$OUT_DIR"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/tandem-inductor
"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "gpu_stages: torch sees no CUDA device")' \
    || exit 1
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,temperature.gpu,clocks.sm,clocks.max.sm \
    --format=csv > "$OUT_DIR/nvidia-smi.csv" 2>&1
cat "$OUT_DIR/nvidia-smi.csv"

if [ -f "$SMOLLM2/model.safetensors" ]; then model=(--model "$SMOLLM2"); else model=(--random-from "$SMOLLM2"); fi
echo "== 1. gpu_stages.py ${model[*]}"
timeout "$STAGES_S" "$PY" bench/engine/gpu_stages.py "${model[@]}" --budget-s $((STAGES_S - 120)) \
    --out "$OUT_DIR/gpu_stages.json" > "$OUT_DIR/gpu_stages.log" 2>&1
echo "gpu_stages: rc=$?"
"$PY" - "$OUT_DIR/gpu_stages.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
m = doc["machine"]
print(f"{m.get('name')} cc {m.get('capability')} torch {m['torch']}: auto -> {m['auto_dtype']['resolved']} "
      f"({m['auto_dtype']['reason']}); matmul bf16 {m['matmul_bfloat16_tflop_s']} TFLOP/s, fp32 "
      f"{m['matmul_float32_tflop_s']}; copy {m['copy_read_plus_write_gb_s']} GB/s")
for name, row in doc["decode"].items():
    rates = {c: (r["tok_s"], r["step_ms"], r.get("vs_eager_same_dtype") or r.get("vs_bfloat16_eager"))
             for c, r in row["by_concurrency"].items()}
    print(f"  {name:17} build {row['build_s']:>6}s compile {row['compile'].get('enabled')} "
          f"{row['compile'].get('fallback') or ''} agree {row.get('greedy_vs_float32_eager', {}).get('share')}: "
          f"(tok/s, ms/step, ratio) {rates}")
print("  prefill", json.dumps(doc.get("prefill")))
print("  skipped", doc["skipped"], "errors", doc["errors"])
PY

echo "== 2. gpu_worker_check.py (tiny)"
timeout 220 "$PY" bench/engine/gpu_worker_check.py --model var/models/tiny --logs /tmp/gpu-worker-check \
    > "$OUT_DIR/gpu_worker_check.json" 2> "$OUT_DIR/gpu_worker_check.err"
echo "gpu_worker_check: rc=$?"
"$PY" - "$OUT_DIR/gpu_worker_check.json" <<'PY' || tail -20 "$OUT_DIR/gpu_worker_check.err"
import json, sys
doc = json.load(open(sys.argv[1]))
for name, check in doc["checks"].items():
    print(f"  {name:58} {check['ok']}")
print("  failures", doc["failures"])
PY
tail -c 3000 /tmp/gpu-worker-check/*.log > "$OUT_DIR/worker_logs_tail.txt" 2>/dev/null
