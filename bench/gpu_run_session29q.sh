#!/usr/bin/env bash
# Twenty-ninth session, seventeenth call: `--sections m1cfg` again after sections m1x and m1cfg were made to share
# _m1_alternate (a check that the refactored bench runs; the same forms as the fifteenth call).
set -uo pipefail
source bench/gpu_env.sh
step "m1cfg"
timeout 250 python3 bench/quant_decode_sweep.py --sections m1cfg --out "$OUT/s29q_m1cfg" 2>&1 | grep -E "MoE|  |Error|error" \
  | tail -20
step "done"
