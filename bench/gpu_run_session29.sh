#!/usr/bin/env bash
# Twenty-ninth session, first call: the one-token NVFP4 experts in one persistent kernel (kernels/nvfp4_m1_fused.py,
# new): its GPU test and nvfp4_m1's; nvfp4_m1 bit for bit against the tree before (its device helpers moved into
# DEVICE_M1, shared); bench/m1_fused.py (fused configs against nvfp4_m1.experts in one process, the timeline).
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU tests"
PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1_fused.py \
  tests/kernels/test_nvfp4_m1.py -k "gpu" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert|^E " | tail -20
step "nvfp4_m1 bit for bit against the tree before"
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
PYTHONPATH=/tmp/site:$PWD/.base_src/src timeout 100 python3 bench/m1_same.py --save /tmp/base.pt && \
  timeout 100 python3 bench/m1_same.py --save /tmp/new.pt --compare /tmp/base.pt
step "m1_fused"
timeout 200 python3 bench/m1_fused.py --rounds 3 --timeline --json "$OUT/s29_fused.json" 2>&1 | tail -30
step "done"
