#!/usr/bin/env bash
# Twenty-ninth session, third call: the fused kernel with x staged once a block and h once a block and choice (the second call:
# 74-82 us, items of ~20 us: every item read x or h chunk by chunk from L2, all warps the same few lines), the
# configs 8:8:1, 12:6:1, 16:4:1, 8:6:1, 4:8:1 and fetch_ahead 6: GPU test, bench/m1_fused.py.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1_fused.py \
  -k "gpu" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert|^E " | tail -20
step "m1_fused"
timeout 300 python3 bench/m1_fused.py --rounds 3 --timeline --json "$OUT/s29c_fused.json" 2>&1 | grep -v "^fused Config" \
  | tail -30
step "done"
