#!/usr/bin/env bash
# One device call on nvidia-h200 (~5 min on a fresh machine, most of it Triton compiling): where a
# batch-1 speculative step's time goes on the GPU (bench/spec_breakdown.py, fifth demo model, bf16,
# graphs), then `bench spec` at batch 1 with the adaptive policy's cost-fit fixes.
set -uo pipefail
source bench/gpu_env.sh
step "phase breakdown, batch 1, k=3"
timeout 230 python3 bench/spec_breakdown.py --device cuda --dtype bfloat16 --batch 1 --k 3 --max-tokens 96 2>&1 \
  | tee "$OUT/breakdown.log" | grep -E "^\||^\(|Error|error"
step "bench spec, batch 1"
timeout 120 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 \
  --json "$OUT/spec.json" --plot "$OUT/spec.png" 2>&1 | tee "$OUT/spec_bench.log" | grep -E "^\||KDA path|Error|error"
save_triton_cache
step "done"
