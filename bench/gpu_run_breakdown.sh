#!/usr/bin/env bash
# One device call (~3 min): where a decode step's time goes, phase by phase (bench/spec_breakdown.py, each
# phase synchronized), plain vs speculative: batch 64 adaptive (0.73x of plain in bench spec this session:
# which phase holds the extra time), batch 1 k=3 (host time between a spec step's graphs).
set -uo pipefail
source bench/gpu_env.sh
step "batch 64: off vs adaptive, phases"
timeout 150 python3 bench/spec_breakdown.py --device cuda --dtype bfloat16 --batch 64 --k 3 --adaptive \
  --max-tokens 96 2>&1 | grep -E "^\||Error|error"
step "batch 1: off vs k=3, phases"
timeout 120 python3 bench/spec_breakdown.py --device cuda --dtype bfloat16 --batch 1 --k 3 \
  --max-tokens 96 2>&1 | grep -E "^\||Error|error"
step "done"
