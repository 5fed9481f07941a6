#!/usr/bin/env bash
# One device call on nvidia-h200 (< 600 s): speculative decoding with verify / commit / MTP draft
# steps replayed from CUDA graphs (engine/graphs.py).
#  1. greedy tokens with MTP drafts vs plain decoding, float32 and bf16 (gpu_check_spec.py; graphs on);
#  2. where a step's time goes, plain vs k=3, batch 1 (spec_breakdown.py; spec_profile.py when this call ran);
#  3. `tpserve bench spec` (bf16): plain vs fixed k vs adaptive, batch 1, 16 and 64.
# Needs the wheels in .whl (bench/gpu_env.sh lists them).
set -uo pipefail
source bench/gpu_env.sh
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
step "speculative decoding with graphs: greedy tokens vs plain"
timeout 200 python3 bench/gpu_check_spec.py --device cuda 2>&1 | tee "$OUT/spec_check.log" | grep -E "^\||Error|error"
step "step profile, batch 1"
timeout 120 python3 bench/spec_breakdown.py --device cuda --k 3 2>&1 | tee "$OUT/spec_breakdown.log" | grep -E "^\||Error"
step "bench spec (bf16, graphs)"
timeout 330 python3 -m tpserve.cli bench spec --device cuda --batch 1 16 64 --k 1 3 5 --max-tokens 96 \
  --json "$OUT/spec.json" --plot "$OUT/spec.png" 2>&1 | tee "$OUT/spec_bench.log" | grep -E "^\||plot|Error|error"
step "done"
