#!/usr/bin/env bash
# Twentieth session, first call (~6 min): W8A16 at 8 rows (then 4 and 2), both shapes, every config printed: the
# float16 MMA path (`half`: e4m3 -> float16 one conversion per two values, x's rows scaled into float16 per K tile;
# the tile as the MMA's A or B operand) beside qtile B (the best so far, 59% / 49%); then W8A16 at one row on
# 4096 x 12288 (77%) with fewer rows and warps per 4096-wide K tile, and the prefetch.
set -uo pipefail
source bench/gpu_env.sh
step "W8A16 at 8 / 4 / 2 rows: float16 MMA path against qtile B"
timeout 420 python3 bench/quant_decode_sweep.py --sections w8half --out "$OUT/w8half" 2>&1 | tee "$OUT/w8half.log" | grep -v -i warn | head -140
step "W8A16 one row, 4096 x 12288"
timeout 120 python3 bench/quant_decode_sweep.py --sections w8row12k --out "$OUT/w8row12k" 2>&1 | tee "$OUT/w8row12k.log" | grep -v -i warn | head -40
step "done"
