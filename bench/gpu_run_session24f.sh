#!/usr/bin/env bash
# Twenty-fourth session, sixth call: nvfp4_m1's experts at 1 and 8 tokens, gate|up's and down's configs swept one at
# a time around the defaults (quant_decode_sweep --sections m1exp): the MoE layer at 1 token is at 55% of its floor.
set -uo pipefail
source bench/gpu_env.sh
step "m1exp"
timeout 240 python3 bench/quant_decode_sweep.py --sections m1exp --out "$OUT" 2>&1 | tee "$OUT/s24f_m1exp.log" \
  | grep -v "^  .*WRONG" | tail -40
grep -c WRONG "$OUT/s24f_m1exp.log"
step "done"
