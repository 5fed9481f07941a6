#!/usr/bin/env bash
# Twenty-ninth session, second call: the fused kernel with one block of 8 warps an SM and 8 stages a warp (the
# first call's 20 warps an SM with 3-4 stages ran at 28% of the floor: items of ~36 us, 1-2 a warp), the next item
# taken late (no item held long before it can start), readiness asked by lane 0 only: GPU test, bench/m1_fused.py.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1_fused.py \
  -k "gpu" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert|^E " | tail -20
step "m1_fused"
timeout 300 python3 bench/m1_fused.py --rounds 3 --timeline --json "$OUT/s29b_fused.json" 2>&1 | grep -v "^fused Config" \
  | tail -30
step "done"
