#!/usr/bin/env bash
# Fifth device call of the twelfth session (~4 min): gpu_run_session12d.sh measured fixed k=5 at 1.125x of
# fixed k=3 at batch 1 (the demo model's drafts are accepted 94-98% per position on these prompts), so the
# best fixed k is above 3. Batch 1: fixed k=5 vs plain, adaptive (k<=5) vs fixed k=5, fixed k=7 vs fixed k=5.
set -uo pipefail
source bench/gpu_env.sh
step "batch 1: fixed k=5 vs off, interleaved"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 5 --max-tokens 96 --rounds 8 --baseline off \
  --candidate fixed 2>&1 | grep -E "^median|Error|error|Traceback"
step "batch 1: adaptive (k<=5) vs fixed k=5, interleaved"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 5 --max-tokens 96 --rounds 8 \
  2>&1 | grep -E "^median|k per step|measured rates|acceptance per|Error|error|Traceback"
step "batch 1: fixed k=7 vs fixed k=5, interleaved"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 7 --fixed-k 5 --max-tokens 96 --rounds 6 \
  --candidate fixed 2>&1 | grep -E "^median|Error|error|Traceback"
step "done"
