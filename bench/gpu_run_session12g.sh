#!/usr/bin/env bash
# Seventh device call of the twelfth session (~2 min): where the next step is fused and both modes are
# measured, the adaptive k comes from the measurements alone (0 or the largest; no cost-model choice), and
# the measured rates decide their mode once per update. Batch 1, adaptive (k<=5) vs fixed k=5.
set -uo pipefail
source bench/gpu_env.sh
step "batch 1: adaptive (k<=5) vs fixed k=5, interleaved"
timeout 100 python3 bench/spec_ab.py --device cuda --batch 1 --k 5 --max-tokens 96 --rounds 10 \
  2>&1 | grep -E "^median|k per step|measured rates|Error|error|Traceback"
step "done"
