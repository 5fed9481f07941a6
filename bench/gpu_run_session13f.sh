#!/usr/bin/env bash
# Thirteenth session, sixth call (~5 min):
# 1. batch 64, the A/A control of plain decoding (off vs off) over two pairs of engines, then adaptive (k<=5)
#    vs off again (the fifth call: 0.909 / 0.914 per pair; earlier single pairs 0.963-1.025);
# 2. real-width KKKM decode with the plain decode graph replayed alone between two steps of the running
#    batch (the fifth call's replay after the batch had finished hit an illegal address): last, so that a
#    crash costs nothing else.
set -uo pipefail
source bench/gpu_env.sh
step "batch 64: A/A off vs off, two pairs of engines"
timeout 110 python3 bench/spec_ab.py --device cuda --batch 64 --k 5 --max-tokens 96 --rounds 6 --pairs 2 --baseline off \
  --candidate off --json "$OUT/ab_b64_off_off_pairs.json" 2>&1 | grep -E "^median|Error|error|Traceback"
step "batch 64: adaptive (k<=5) vs off, two pairs of engines"
timeout 110 python3 bench/spec_ab.py --device cuda --batch 64 --k 5 --max-tokens 96 --rounds 6 --pairs 2 --baseline off \
  --json "$OUT/ab_b64_adaptive5_off_pairs2.json" 2>&1 | grep -E "^median|k per step|Error|error|Traceback"
step "real-width KKKM decode, graph replay alone"
timeout 120 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
  --decode-steps 32 --batch 1 32 64 --json "$OUT/model_kkkm_replay.json" 2>&1 | grep -E "^\| (decode|prefill)|Error|error" | head -8
step "done"
