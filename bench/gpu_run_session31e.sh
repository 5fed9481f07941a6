#!/usr/bin/env bash
# Thirty-first session, fifth call: issue 12 after two more host calls left adaptive k's walk (while_waiting only
# where a rate is pending; Speculator._left a loop): greedy batch 1, adaptive and fixed k = 7 twice each on one
# engine, 96 tokens a request (48 rounds; the first run compiles on a fresh machine) and 32 (64 rounds), with
# --host-times; spec_sides now also checks that every side gave the same greedy tokens.
set -uo pipefail
source bench/gpu_env.sh
for nrt in 96:48:380 32:64:190; do
  IFS=: read -r n r t <<< "$nrt"
  step "greedy batch 1, $n tokens, $r rounds: adaptive, k=7, adaptive, k=7"
  timeout $t python3 bench/spec_sides.py --device cuda --k 7 --sides adaptive,7,adaptive,7 --batch 1 --max-tokens $n \
    --rounds $r --host-times --json "$OUT/s31e_sides_$n.json" 2>&1 | tee "$OUT/s31e_sides_$n.log" \
    | grep -E "^median|pooled|/ adaptive#1|/ k=7#1:|best fixed|^\| (side|adap|k=7)|k per step|identical|Error|error|Traceback"
done
step "done"
