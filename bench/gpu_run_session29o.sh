#!/usr/bin/env bash
# Twenty-ninth session, fifteenth call: gate|up with two row tiles of each part a warp (512 blocks instead of 1024:
# half the reads of x, whose few L2 lines every block reads at once, which the fused kernel's first form showed to
# be a hot spot) against the default: `--sections m1cfg` (new), 1, 2 and 8 tokens.
set -uo pipefail
source bench/gpu_env.sh
step "m1cfg"
timeout 250 python3 bench/quant_decode_sweep.py --sections m1cfg --out "$OUT/s29o_m1cfg" 2>&1 | grep -E "MoE|  |Error|error" \
  | tail -20
step "done"
