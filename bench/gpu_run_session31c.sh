#!/usr/bin/env bash
# Thirty-first session, third call: issue 12 after adaptive k learned to end a request plainly where `left` plain
# steps measure shorter than one fused step (Speculator._ends_sooner_plainly): greedy batch 1, adaptive and fixed
# k = 7 twice each on one engine, 48 rounds, at 96 and at 32 tokens a request.
set -uo pipefail
source bench/gpu_env.sh
for n in 96 32; do
  step "greedy batch 1, $n tokens: adaptive, k=7, adaptive, k=7"
  timeout 280 python3 bench/spec_sides.py --device cuda --k 7 --sides adaptive,7,adaptive,7 --batch 1 --max-tokens $n \
    --rounds 48 --json "$OUT/s31c_sides_$n.json" 2>&1 | tee "$OUT/s31c_sides_$n.log" \
    | grep -E "^median|pooled|/ adaptive#1|/ k=7#1:|best fixed|k per step|measured rates|Error|error|Traceback"
done
step "done"
