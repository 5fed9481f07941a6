#!/usr/bin/env bash
# Twenty-eighth session, second call: nvfp4_m1 with x's chunk in each cp.async stage (no block-wide x staging; gate|up
# writes h in the "shift" decode's order and scale): outputs bit for bit against the tree before (.base_src), the GPU
# tests, the block timelines again, then the experts at 1, 2 and 8 tokens (m1pdl: plain and PDL), trees alternated.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
step "bit for bit against the tree before"
PYTHONPATH=/tmp/site:$PWD/.base_src/src timeout 120 python3 bench/m1_same.py --save /tmp/base.pt
timeout 120 python3 bench/m1_same.py --save /tmp/new.pt --compare /tmp/base.pt
step "GPU tests"
timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1.py tests/kernels/test_pdl.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error" | tail -8
step "timeline"
timeout 120 python3 bench/m1_timeline.py --tokens 1 8 --json "$OUT/s28b_timeline.json" 2>&1 | tee "$OUT/s28b_timeline.txt" | head -14
for round in 1 2; do
  for tree in base new; do
    src=$PWD/src; [ $tree = base ] && src=$PWD/.base_src/src
    step "m1pdl $tree ($round)"
    PYTHONPATH=/tmp/site:$src timeout 150 python3 bench/quant_decode_sweep.py --sections m1pdl --out "$OUT/s28b_m1pdl_${tree}_$round" 2>&1 | grep -E "MoE|Error|error" | tail -4
  done
done
step "done"
