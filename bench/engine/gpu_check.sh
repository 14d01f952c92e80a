#!/usr/bin/env bash
# GPU check, one command on a CUDA host (about 3-4 minutes on one modern GPU; every step has a deadline):
#
#     bash bench/engine/gpu_check.sh     # PYTHON=/path/to/python to use another interpreter than .venv
#
# 1. the engine's greedy-equality tests (they run the engine on the CPU: its scheduling and KV logic on this host);
# 2. greedy equality ON THE GPU in float32: the engine's tokens for 8 and 32 concurrent prompts must equal those of a
#    plain Hugging Face static batch and of one-by-one `generate` (fails the check otherwise);
# 3. decode throughput in bfloat16 on the GPU, tiny model and SmolLM2, 1/8/32 concurrent requests, vs the baselines
#    (in bfloat16 a batched and an unbatched run may round differently, so equality there is reported, not required).
# JSON results go to bench/results/gpu-*.json; the last lines print the headline figures.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
OUT=bench/results
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

"$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "gpu_check: torch sees no CUDA device")'
"$PY" -c 'import torch; print("gpu_check:", torch.cuda.get_device_name(0), "torch", torch.__version__)'

echo "== models"
timeout 120 "$PY" -m inference.models prepare tiny
timeout 180 "$PY" -m inference.models prepare smollm2

echo "== 1. engine greedy-equality tests"
# -p no:django: these tests never touch the control plane, and a GPU host need not have its settings.
timeout 180 "$PY" -m pytest -q -p no:django \
    tests/inference/engine/test_greedy.py \
    tests/inference/engine/test_continuous_batching.py \
    tests/inference/engine/test_disaggregated.py

echo "== 2. greedy equality on the GPU (float32)"
timeout 240 "$PY" bench/engine/decode_throughput.py --model tiny --device cuda --dtype float32 --concurrency 8,32 \
    --methods engine,static,hf_generate --sequential-requests 8 --repeats 1 > "$OUT/gpu-$STAMP-greedy-fp32.json"
"$PY" - "$OUT/gpu-$STAMP-greedy-fp32.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
bad = {c: {k: v for k, v in row.items() if k.endswith("_matches_static") and v != 1.0}
       for c, row in doc["results"].items()}
bad = {c: b for c, b in bad.items() if b}
if doc["errors"] or bad or set(doc["results"]) != {"8", "32"}:
    sys.exit(f"gpu_check: greedy equality FAILED: mismatches {bad}, errors {doc['errors']}")
print("gpu_check: engine == static batch == one-by-one generate, greedy, float32, 8 and 32 concurrent prompts")
PY

echo "== 3. decode throughput (bfloat16)"
for model in tiny smollm2; do
    timeout 300 "$PY" bench/engine/decode_throughput.py --model "$model" --device cuda --dtype bfloat16 \
        --concurrency 1,8,32 --sequential-requests 4 --repeats 2 > "$OUT/gpu-$STAMP-decode-$model.json"
done

"$PY" - "$OUT"/gpu-"$STAMP"-decode-*.json <<'PY'
import json, sys
for path in sys.argv[1:]:
    doc = json.load(open(path))
    print(f"{doc['model']} ({doc['num_params'] / 1e6:.1f}M params, {doc['dtype']}) errors={doc['errors'] or 'none'}")
    for conc, row in doc["results"].items():
        figures = ", ".join(f"{k}={v}" for k, v in row.items() if k.endswith("_tok_s") or k.startswith("engine_vs"))
        print(f"  {conc:>2} concurrent: {figures}")
    print(f"  goals at {doc['goals_at']}: {doc['goals']}")
PY
echo "gpu_check: done; JSON in $OUT/gpu-$STAMP-*.json"
