#!/usr/bin/env bash
# Thirty-first session, fourth call: issue 12 with the end-of-request rule made cheap (MeasuredRates.measured_k: the
# decision and its plain-steps threshold in one lookup): greedy batch 1, adaptive and fixed k = 7 twice each on one
# engine, at 32 tokens a request (64 rounds) and 96 (32 rounds), with --host-times and --gc-stats (new: Python's
# garbage collections per side).
set -uo pipefail
source bench/gpu_env.sh
for nr in 32:64 96:32; do
  n=${nr%:*}; r=${nr#*:}
  step "greedy batch 1, $n tokens, $r rounds: adaptive, k=7, adaptive, k=7"
  timeout 270 python3 bench/spec_sides.py --device cuda --k 7 --sides adaptive,7,adaptive,7 --batch 1 --max-tokens $n \
    --rounds $r --host-times --gc-stats --json "$OUT/s31d_sides_$n.json" 2>&1 | tee "$OUT/s31d_sides_$n.log" \
    | grep -E "^median|pooled|/ adaptive#1|/ k=7#1:|best fixed|^\| (side|adap|k=7)|k per step|garbage|Error|error|Traceback"
done
step "done"
