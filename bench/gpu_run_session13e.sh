#!/usr/bin/env bash
# Thirteenth session, fifth call (~5 min):
# 1. real-width KKKM decode at batch 1 / 32 / 64 with the decode graph also replayed alone (back to back, no
#    host work between): how much of a step the GPU waits for the host;
# 2. spec_ab over two pairs of engines built in opposite orders (one A/A pair differed by 6% in the third call):
#    A/A fixed k=7 vs fixed k=7; adaptive (k<=7) vs fixed k=7; batch 64 adaptive (k<=5) vs off.
set -uo pipefail
source bench/gpu_env.sh
step "real-width KKKM decode, graph replay alone"
timeout 120 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
  --decode-steps 32 --batch 1 32 64 --json "$OUT/model_kkkm_replay.json" 2>&1 | grep -E "^\| (decode|prefill)|Error|error" | head -8
step "A/A: fixed k=7 vs fixed k=7, two pairs of engines"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 1 --k 7 --fixed-k 7 --max-tokens 96 --rounds 8 --pairs 2 \
  --candidate fixed --json "$OUT/ab_fixed7_fixed7_pairs.json" 2>&1 | grep -E "^median|Error|error|Traceback"
step "batch 1: adaptive (k<=7) vs fixed k=7, two pairs of engines"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 1 --k 7 --max-tokens 96 --rounds 8 --pairs 2 \
  --json "$OUT/ab_adaptive7_fixed7_pairs.json" 2>&1 | grep -E "^median|k per step|Error|error|Traceback"
step "batch 64: adaptive (k<=5) vs off, two pairs of engines"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 64 --k 5 --max-tokens 96 --rounds 6 --pairs 2 --baseline off \
  --json "$OUT/ab_b64_adaptive5_off_pairs.json" 2>&1 | grep -E "^median|k per step|Error|error|Traceback"
save_triton_cache
step "done"
