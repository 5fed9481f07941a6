#!/usr/bin/env bash
# One device call on nvidia-h200 (< 400 s): the quantized decode GEMV against the tiled kernel, with
# every config checked for a right answer before it is timed (bench/quant_kernels.py MAX_REL_ERR).
set -uo pipefail
source bench/gpu_env.sh
step "quantized GEMV vs tiled"
timeout 360 python3 bench/quant_kernels.py --sections w4a16,w8a16 --out "$OUT" 2>&1 | tee "$OUT/quant.log" \
  | grep -E "^\||\[|Error|error"
save_triton_cache
step "done"
