#!/usr/bin/env bash
# Twenty-eighth session, sixth call: gate|up split over K across blocks (Config.k_splits; the tile's last block adds
# the fp32 sums and writes h): the GPU test, then `--sections m1x` with the tree before's nvfp4_m1 in the same process
# (M1X_BASE), and a one-token timeline of the 4-split form.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
timeout 150 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1.py -k "split or match_fp32" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert" | tail -8
step "m1x"
M1X_BASE=$PWD/.base_src/src/tpserve/kernels/nvfp4_m1.py timeout 300 python3 bench/quant_decode_sweep.py \
  --sections m1x --out "$OUT/s28f_m1x" 2>&1 | grep -E "MoE|  |Error|error" | tail -24
step "done"
