#!/usr/bin/env bash
# Twenty-eighth session, twelfth call: the final tree's GPU tests (test_nvfp4_m1.py, test_pdl.py), then
# `--sections m1x` (1, 2, 8, 32 tokens) with the tree before the session's nvfp4_m1 (80c32de) in the same process.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU tests"
timeout 300 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1.py tests/kernels/test_pdl.py 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert" | tail -8
step "m1x"
M1X_BASE=$PWD/.base_src/src/tpserve/kernels/nvfp4_m1.py timeout 200 python3 bench/quant_decode_sweep.py \
  --sections m1x --out "$OUT/s28l_m1x" 2>&1 | grep -E "MoE|  |Error|error" | tail -24
step "done"
