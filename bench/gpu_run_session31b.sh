#!/usr/bin/env bash
# Thirty-first session, second call: bench/m1_configs.py (new): down_sum with deeper rings (3-8 stages, 4 or 8 warps;
# each block issues stages - 1 of them before its PDL wait on gate|up) against the defaults at 1 and 2 tokens.
set -uo pipefail
source bench/gpu_env.sh
step "m1_configs: down's ring depth"
timeout 400 python3 bench/m1_configs.py --down 1:8:3,1:8:4,1:4:4,1:4:6,1:4:8 --tokens 1,2 --json "$OUT/s31b_down.json" \
  2>&1 | grep -E "MoE|  |Error|error" | tail -20
step "done"
