#!/usr/bin/env bash
# Sixth device call of the twelfth session (~3 min): where the next step can be fused the adaptive k is 0 or
# the largest (a fused step is padded to it: gpu_run_session12e.sh saw k = 3 or 4 of 5 on 5% of steps), and
# a lead over 1.5x re-measures the slower mode every 1024th step. Batch 1 adaptive vs fixed at k = 5 and 3;
# batch 64 adaptive vs plain.
set -uo pipefail
source bench/gpu_env.sh
step "batch 1: adaptive (k<=5) vs fixed k=5, interleaved"
timeout 100 python3 bench/spec_ab.py --device cuda --batch 1 --k 5 --max-tokens 96 --rounds 8 \
  2>&1 | grep -E "^median|k per step|measured rates|Error|error|Traceback"
step "batch 1: adaptive (k<=3) vs fixed k=3, interleaved"
timeout 100 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 8 \
  2>&1 | grep -E "^median|k per step|measured rates|Error|error|Traceback"
step "batch 64: adaptive (k<=5) vs off, interleaved"
timeout 100 python3 bench/spec_ab.py --device cuda --batch 64 --k 5 --max-tokens 96 --rounds 6 --baseline off \
  2>&1 | grep -E "^median|k per step|Error|error|Traceback"
step "done"
