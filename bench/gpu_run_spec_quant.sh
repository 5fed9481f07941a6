#!/usr/bin/env bash
# One device call on nvidia-h200 (< 600 s), fifth session of 2026-12-01:
#  1. fla-core's KDA self-test per head size (which kernels the engine uses: gpu_check_fla.py);
#  2. the quantized decode GEMV (kernels/quant_gemv.py) against the tiled split-K kernel, config sweep;
#  3. speculative decoding on the retrained demo model: greedy tokens vs plain (gpu_check_spec.py),
#     then `tpserve bench spec` (bf16, graphs): plain vs fixed k vs adaptive at batch 1 and 64.
# Needs the wheels in .whl (bench/gpu_env.sh lists them).
set -uo pipefail
source bench/gpu_env.sh
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
step "fla-core KDA self-test by head size"
timeout 60 python3 bench/gpu_check_fla.py 2>&1 | tee "$OUT/fla_check.log" | grep -E "^\||Error"
step "quantized GEMV vs tiled"
timeout 170 python3 bench/quant_kernels.py --sections w8a16,w4a16 --out "$OUT" 2>&1 | tee "$OUT/quant.log" \
  | grep -E "^\||\[|Error|error"
step "speculative decoding: greedy tokens vs plain"
timeout 120 python3 bench/gpu_check_spec.py --device cuda 2>&1 | tee "$OUT/spec_check.log" | grep -E "^\||Error|error|KDA"
step "bench spec (bf16, graphs)"
timeout 220 python3 -m tpserve.cli bench spec --device cuda --batch 1 64 --k 3 5 --max-tokens 96 \
  --json "$OUT/spec.json" --plot "$OUT/spec.png" 2>&1 | tee "$OUT/spec_bench.log" | grep -E "^\||plot|Error|error"
step "done"
