#!/usr/bin/env bash
# One device call on nvidia-h200 (~3 min with a carried Triton cache): which kernels a decode step
# runs and for how long, phase by phase (bench/decode_profile.py: the demo model, bf16, graphs,
# plain decoding and k=3 drafts).
set -uo pipefail
source bench/gpu_env.sh
step "demo model: kernels per phase, batch 1, plain and k=3"
timeout 300 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 40 \
  --json "$OUT/decode_profile_demo.json" 2>&1 | tee "$OUT/decode_profile_demo.log" | grep -E "^\||^#|^off|^k=|Error|error"
step "done"
