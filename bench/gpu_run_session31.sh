#!/usr/bin/env bash
# Thirty-first session, first call: bench/m1_alu_bound.py (new) at 1, 2 and 8 tokens: nvfp4_m1's experts beside
# copies whose decode does one shift and one mask a word ("one-op") or nothing ("none"), values wrong by design: how
# much of the one-token layer's 39-40 us a cheaper decode could remove at best.
set -uo pipefail
source bench/gpu_env.sh
step "m1_alu_bound"
timeout 400 python3 bench/m1_alu_bound.py --tokens 1,2,8 --json "$OUT/s31_alu.json" 2>&1 | grep -E "MoE|  |Error|error" \
  | tail -20
step "done"
