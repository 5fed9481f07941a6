#!/usr/bin/env bash
# Twenty-second session, third call (~7 min): (1) issue 12, greedy batch 1 on one engine: adaptive (k <= 7) against
# fixed k = 7 twice, the repeated fixed side the A/A control (the first call's run of this timed out compiling on a
# fresh machine); (2) top-k by torch.topk of the largest k instead of sorting the vocabulary (after the second
# call's h2d change): plain decoding, greedy and sampled, batch 1 and 8.
set -uo pipefail
source bench/gpu_env.sh
step "greedy batch 1: adaptive, k=7, k=7 (A/A) on one engine"
timeout 330 python3 bench/spec_sides.py --device cuda --k 7 --sides adaptive,7,7 --batch 1 --max-tokens 96 \
  --rounds 24 --json "$OUT/sides_greedy_b1.json" 2>&1 | tee "$OUT/sides_greedy_b1.log" \
  | grep -E "^median|/|k per step|measured rates|acceptance|Error|error|Traceback"
for b in 1 8; do
  step "plain decoding, batch $b: top-k by topk"
  timeout 90 python3 bench/sampled_decode.py --device cuda --batch $b --rounds 3 \
    --json "$OUT/sampled_b${b}_topk.json" 2>&1 | grep -E "^\||Error|error|Traceback"
done
step "done"
