#!/usr/bin/env bash
# Twenty-fourth session, seventh call: the experts' defaults after the sixth call's one-at-a-time sweep (gate|up 2
# warps; down at more than 8 pairs 2 row tiles and 2 warps), measured together: quant_decode_sweep --sections m1def.
set -uo pipefail
source bench/gpu_env.sh
step "m1def"
timeout 150 python3 bench/quant_decode_sweep.py --sections m1def --out "$OUT" 2>&1 | tee "$OUT/s24g_m1def.log" | tail -22
step "done"
