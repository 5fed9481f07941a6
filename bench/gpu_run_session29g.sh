#!/usr/bin/env bash
# Twenty-ninth session, seventh call: the code as committed (a __syncwarp before the ring is refilled, which the sixth
# call did not have): the GPU test, and bench/m1_fused.py at the default config (16 x 3) against nvfp4_m1.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1_fused.py \
  -k "gpu" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert|^E " | tail -20
step "m1_fused"
timeout 300 python3 bench/m1_fused.py --configs 16:3:1 --rounds 3 --timeline --json "$OUT/s29g_fused.json" 2>&1 | grep -v "^fused Config" \
  | tail -30
step "done"
