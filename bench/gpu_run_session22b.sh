#!/usr/bin/env bash
# Twenty-second session, second call (~6 min): the first call found sampled decoding far slower than greedy with
# speculation (732 tok/s plain sampled at batch 1). A sampled step copied its settings to the device with blocking
# copies, each a stream sync that waits for the step async scheduling just launched (engine/h2d.py, new). Plain
# decoding, greedy and sampled (bench/sampled_decode.py, new), on the tree before the change (.base_src: `git
# archive 2c38bf2 src`, carried; the built-in model linked from this tree) and after it, batch 1 and 8; then
# sampled speculation on the new tree (adaptive against fixed k = 7, 3, 2 on one engine).
set -uo pipefail
source bench/gpu_env.sh
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
for b in 1 8; do
  step "plain decoding, batch $b: before (2c38bf2)"
  PYTHONPATH=/tmp/site:$PWD/.base_src/src timeout 130 python3 bench/sampled_decode.py --device cuda --batch $b \
    --rounds 3 --json "$OUT/sampled_b${b}_before.json" 2>&1 | grep -E "^\||Error|error|Traceback"
  step "plain decoding, batch $b: after"
  timeout 130 python3 bench/sampled_decode.py --device cuda --batch $b --rounds 3 \
    --json "$OUT/sampled_b${b}_after.json" 2>&1 | grep -E "^\||Error|error|Traceback"
done
step "sampled (T 0.8) batch 1 speculation: adaptive, k=7, 3, 2 on one engine (after)"
timeout 150 python3 bench/spec_sides.py --device cuda --k 7 --sides adaptive,7,3,2 --temperature 0.8 --batch 1 \
  --max-tokens 96 --rounds 5 --json "$OUT/sides_t08_b1_after.json" 2>&1 | tee "$OUT/sides_t08_b1_after.log" \
  | grep -E "^median|/|k per step|measured rates|Error|error|Traceback"
save_triton_cache
step "done"
