#!/usr/bin/env bash
# Twenty-second session, first call (~9 min): issue 12's "adaptive k >= the best fixed k, measured in one run", on
# one engine (bench/spec_sides.py, new: every side switched on the same engine, order rotated per round). (1) Greedy
# batch 1: adaptive (k <= 7) against fixed k = 7 twice: the repeated fixed side is the A/A control, so the spread of
# fixed / fixed says what the measurement moves by itself (spec_ab's adaptive / fixed was 0.993-0.997 in three calls).
# (2) Sampled (temperature 0.8, unseeded) batch 1: no fused steps, drafts depth by depth, so a fixed k below 7 costs
# what it would on an engine built with it: adaptive against fixed k = 7, 5, 3, 2. (3) The same sampled at batch 8.
set -uo pipefail
source bench/gpu_env.sh
step "greedy batch 1: adaptive, k=7, k=7 (A/A) on one engine"
timeout 200 python3 bench/spec_sides.py --device cuda --k 7 --sides adaptive,7,7 --batch 1 --max-tokens 96 \
  --rounds 24 --json "$OUT/sides_greedy_b1.json" 2>&1 | tee "$OUT/sides_greedy_b1.log" \
  | grep -E "^median|/|k per step|measured rates|acceptance|Error|error|Traceback"
step "sampled (T 0.8) batch 1: adaptive, k=7, 5, 3, 2 on one engine"
timeout 230 python3 bench/spec_sides.py --device cuda --k 7 --sides adaptive,7,5,3,2 --temperature 0.8 --batch 1 \
  --max-tokens 96 --rounds 8 --json "$OUT/sides_t08_b1.json" 2>&1 | tee "$OUT/sides_t08_b1.log" \
  | grep -E "^\| [0-9]|^median|/|k per step|measured rates|acceptance|Error|error|Traceback"
step "sampled (T 0.8) batch 8: adaptive, k=7, 5, 3, 2 on one engine"
timeout 120 python3 bench/spec_sides.py --device cuda --k 7 --sides adaptive,7,5,3,2 --temperature 0.8 --batch 8 \
  --max-tokens 96 --rounds 6 --json "$OUT/sides_t08_b8.json" 2>&1 | tee "$OUT/sides_t08_b8.log" \
  | grep -E "^median|/|k per step|measured rates|acceptance|Error|error|Traceback"
save_triton_cache
step "done"
