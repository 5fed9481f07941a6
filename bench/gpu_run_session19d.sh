#!/usr/bin/env bash
# Nineteenth session, fourth call (~5 min): (1) W4A16 at one row with the new default (the one-row kernel, float16
# decode, 16 x 512, 4 warps, one stage) beside the old best and default, both shapes, and its PTX decode against
# plain Triton bit for bit; (2) the grouped NVFP4 / FP8 experts' decode sweep, now with one pipeline stage too.
set -uo pipefail
source bench/gpu_env.sh
step "W4A16 one row: the default"
timeout 120 python3 bench/quant_decode_sweep.py --sections w4def --out "$OUT/w4def" 2>&1 | tee "$OUT/w4def.log" | grep -v -i warn | head -30
step "MoE decode sweep (stages 1-5)"
timeout 330 python3 bench/quant_decode_sweep.py --sections moe --out "$OUT/moe" 2>&1 | tee "$OUT/moe.log" \
  | grep -v "^\s*$" | grep -v -i warn | head -60
step "done"
