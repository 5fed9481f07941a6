#!/usr/bin/env bash
# Twenty-ninth session, sixth call: items over a slice of K (k_splits 2 and 4: a tile's slices taken by neighbouring
# warps at about the same time, so a row's bytes are read together, as nvfp4_m1's two warps a block split K;
# the fifth call: 16 x 3 best at 53.8 us, more warps slower, DRAM at ~2.1 TB/s in both phases):
# GPU test, bench/m1_fused.py.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1_fused.py \
  -k "gpu" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert|^E " | tail -20
step "m1_fused"
timeout 300 python3 bench/m1_fused.py --rounds 2 --timeline --json "$OUT/s29f_fused.json" 2>&1 | grep -v "^fused Config" \
  | tail -30
step "done"
