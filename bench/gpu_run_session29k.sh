#!/usr/bin/env bash
# Twenty-ninth session, eleventh call: the fused kernel with items taken by whole blocks (a block's warps take an
# item's tasks, a chunk of two row tiles each, in turn; the item's last task sums them in task order): an item
# ends in about a task's time, in about the order items were taken, so down items can start while later pairs'
# gate|up items stream (the tenth call: warp items all ran at once and ended together, 52.8 us at best). The GPU
# test, bench/m1_fused.py with the timeline.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1_fused.py \
  -k "gpu" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert|^E " | tail -20
step "m1_fused"
timeout 300 python3 bench/m1_fused.py --rounds 2 --timeline --json "$OUT/s29k_fused.json" 2>&1 | grep -v "^fused Config" \
  | tail -30
step "done"
