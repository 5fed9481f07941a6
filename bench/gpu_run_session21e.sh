#!/usr/bin/env bash
# Twenty-first session, sixth call (~2 min): the nibble-planes sweep again after w4a16_gemv's default at 2-16 rows
# became the planes kernel (64 x 256, 4 warps, 3 stages, K split over 2 waves): the "default" row of each case is
# now that kernel at 2-16 rows (the one-row kernel at one row), timed as the default.
set -uo pipefail
source bench/gpu_env.sh
step "W4A16 nibble planes, defaults"
timeout 480 python3 bench/quant_decode_sweep.py --sections w4planes --out "$OUT/w4planes" 2>&1 \
  | tee "$OUT/w4planes.log" | grep -v -i warn | grep -E "^w4planes|default|PTX" | head -40
step "done"
