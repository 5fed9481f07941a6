#!/usr/bin/env bash
# Twenty-ninth session, tenth call: the fused kernel restructured after the ninth call's Nsight Compute (14% more
# instructions than nvfp4_m1's two kernels, stalls on branches, fences and the item counter's answer): a tight loop
# over an item's chunks (one wait form, the next item's first chunks issued from it), the next item's number asked
# for an item ahead, acq_rel / release atomics for the hand-offs instead of fences, and first items by rank
# (warp-major, so the first pairs' gate|up tiles sit with the warps the schedulers favour); blocks checked to fit
# the SMs at once. GPU test, bench/m1_fused.py with the timeline.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1_fused.py \
  -k "gpu" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert|^E " | tail -20
step "m1_fused"
timeout 300 python3 bench/m1_fused.py --rounds 2 --timeline --json "$OUT/s29j_fused.json" 2>&1 | grep -v "^fused Config" \
  | tail -30
step "done"
