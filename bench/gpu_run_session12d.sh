#!/usr/bin/env bash
# Fourth device call of the twelfth session (~4 min), after host-time cuts: a fixed k no longer feeds the
# adaptive mode's estimators (rates, cost fits), MeasuredRates.observe sorts every 8th step only, the
# policy's step choice is a tuple. Batch 1: fixed k=3 vs plain, adaptive vs fixed k=3, fixed k=5 vs
# fixed k=3 (which fixed k is best on these prompts), interleaved.
set -uo pipefail
source bench/gpu_env.sh
step "batch 1: fixed k=3 vs off, interleaved"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 8 --baseline off \
  --candidate fixed 2>&1 | grep -E "^median|Error|error|Traceback"
step "batch 1: adaptive vs fixed k=3, interleaved"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 8 \
  2>&1 | grep -E "^median|k per step|measured rates|acceptance per|Error|error|Traceback"
step "batch 1: fixed k=5 vs fixed k=3, interleaved"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 1 --k 5 --fixed-k 3 --max-tokens 96 --rounds 6 \
  --candidate fixed 2>&1 | grep -E "^median|Error|error|Traceback"
step "done"
