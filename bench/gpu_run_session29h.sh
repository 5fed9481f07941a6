#!/usr/bin/env bash
# Twenty-ninth session, eighth call: items of two row tiles (gate|up: gate and up side by side, SwiGLU in the warp, as nvfp4_m1;
# down: two tiles of a choice), K in slices: the GPU test, bench/m1_fused.py (configs in its default).
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1_fused.py \
  -k "gpu" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert|^E " | tail -20
step "m1_fused"
timeout 300 python3 bench/m1_fused.py --rounds 2 --timeline --json "$OUT/s29h_fused.json" 2>&1 | grep -v "^fused Config" \
  | tail -30
step "done"
