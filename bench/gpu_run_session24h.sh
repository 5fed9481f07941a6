#!/usr/bin/env bash
# Twenty-fourth session, eighth call: nvfp4_m1's experts with prefetch_down (gate|up's blocks ask L2, evict last,
# for their pair's down weights while they decode: the down kernel then reads them from L2) against without, at
# 1, 2 and 8 tokens, each twice (quant_decode_sweep --sections m1pf). Slower everywhere: the option and the section
# were removed after this call (BENCHMARKS.md, twenty-fourth session); this script records what ran.
set -uo pipefail
source bench/gpu_env.sh
step "m1pf"
timeout 120 python3 bench/quant_decode_sweep.py --sections m1pf --out "$OUT" 2>&1 | tee "$OUT/s24h_m1pf.log" | tail -16
step "done"
