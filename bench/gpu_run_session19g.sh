#!/usr/bin/env bash
# Nineteenth session, seventh call (~1.5 min): the one-row defaults as they now stand, both shapes. W8A16: 4096-wide
# K tiles (4 rows on 8 warps; 8 rows on 4 warps where K >= 8192) beside the eighteenth session's default configs.
# W4A16: the one-row kernel back to its measured loop (x split to meet each code slot; the k-order join measured
# slower in the sixth call), K split below 4 waves.
set -uo pipefail
source bench/gpu_env.sh
step "W8A16 one row: the default"
timeout 150 python3 bench/quant_decode_sweep.py --sections w8def --out "$OUT/w8def" 2>&1 | tee "$OUT/w8def.log" | grep -v -i warn | head -30
step "W4A16 one row: the default"
timeout 100 python3 bench/quant_decode_sweep.py --sections w4def --out "$OUT/w4def" 2>&1 | tee "$OUT/w4def.log" | grep -v -i warn | head -30
step "done"
