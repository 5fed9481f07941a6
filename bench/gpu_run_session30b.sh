#!/usr/bin/env bash
# Thirtieth session, second call: issue 12, greedy batch 1 on one engine: adaptive (k <= 7) and fixed k = 7, each
# twice (both repeated sides are A/A controls), 48 rounds, the pooled adaptive / fixed ratio with its 95% interval.
set -uo pipefail
source bench/gpu_env.sh
step "greedy batch 1: adaptive, k=7, adaptive, k=7 on one engine"
timeout 540 python3 bench/spec_sides.py --device cuda --k 7 --sides adaptive,7,adaptive,7 --batch 1 --max-tokens 96 \
  --rounds 48 --json "$OUT/s30b_sides_greedy_b1.json" 2>&1 | tee "$OUT/s30b_sides_greedy_b1.log" \
  | grep -E "^median|/|k per step|measured rates|acceptance|Error|error|Traceback"
step "done"
