#!/usr/bin/env bash
# Twenty-first session, third call (~3 min): is the NVFP4 GEMVs' common ~17-20 us at 12288 x 4096 (one-row kernel
# 6.0 SASS instructions a weight, qtile 4.1-5.9, the new planes kernel 4.2 on wgmma and on mma.sync alike) DRAM
# locality? Their K steps read 16-256 contiguous bytes a row, the FP8 one-row kernel at 84% 4 KB. The planes kernel
# on tiled weights (one contiguous chunk a step) against row-major, and the one-row kernel with whole-row K tiles.
set -uo pipefail
source bench/gpu_env.sh
step "W4A16: tiled weights, whole-row tiles"
timeout 480 python3 bench/quant_decode_sweep.py --sections w4tiled --out "$OUT/w4tiled" 2>&1 \
  | tee "$OUT/w4tiled.log" | grep -v -i warn | head -150
step "done"
