#!/usr/bin/env bash
# Twenty-fifth session, tenth call: quant_decode_sweep --sections m1exp with down_sum at one token and down under
# PDL (gate|up's config swept with down's default, then down's with gate|up's), 1 and 8 tokens: whether the
# best configs moved.
set -uo pipefail
source bench/gpu_env.sh
step "m1exp"
timeout 400 python3 bench/quant_decode_sweep.py --sections m1exp --out "$OUT" 2>&1 | tee "$OUT/s25i_m1exp.log" \
  | grep -v "^  .*WRONG\|Error" | tail -40
step "done"
