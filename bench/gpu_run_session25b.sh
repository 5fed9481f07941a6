#!/usr/bin/env bash
# Twenty-fifth session, second call: quant_decode_sweep --sections m1par (nvfp4_m1's gate|up and down_sum alone,
# in sequence, and on two streams with no dependency: a bound on what overlapping them could give).
set -uo pipefail
source bench/gpu_env.sh
step "m1par"
timeout 200 python3 bench/quant_decode_sweep.py --sections m1par --out "$OUT" 2>&1 | tee "$OUT/s25b_m1par.log" \
  | tail -14
step "done"
