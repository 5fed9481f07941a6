#!/usr/bin/env bash
# Twenty-eighth session, thirteenth call: x from outside (gate|up, dense) staged before W's first stages so that
# its wait is for x alone (the twelfth call: 32 tokens 1% slower than the tree before): the experts' GPU test, bit
# for bit against the tree before, `--sections m1x` with that tree's nvfp4_m1 (M1X_BASE).
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
timeout 100 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1.py -k "match_fp32" 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert" | tail -8
step "bit for bit against the tree before"
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
PYTHONPATH=/tmp/site:$PWD/.base_src/src timeout 100 python3 bench/m1_same.py --save /tmp/base.pt && \
  timeout 100 python3 bench/m1_same.py --save /tmp/new.pt --compare /tmp/base.pt
step "m1x"
M1X_BASE=$PWD/.base_src/src/tpserve/kernels/nvfp4_m1.py timeout 150 python3 bench/quant_decode_sweep.py \
  --sections m1x --out "$OUT/s28m_m1x" 2>&1 | grep -E "MoE|  |Error|error" | tail -24
step "done"
