#!/usr/bin/env bash
# Twenty-eighth session, eighth call: down_sum on per-pair readiness counts (gate|up counts its blocks done per pair;
# down_sum, launched as gate|up's dependent, takes each choice once its pair is done, x an item at a time): the GPU
# test (bit for bit against the grid-wide wait), then `--sections m1x` with the tree before's nvfp4_m1 (M1X_BASE).
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1.py -k "match_fp32" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert" | tail -8
step "m1x"
M1X_BASE=$PWD/.base_src/src/tpserve/kernels/nvfp4_m1.py timeout 300 python3 bench/quant_decode_sweep.py \
  --sections m1x --out "$OUT/s28h_m1x" 2>&1 | grep -E "MoE|  |Error|error" | tail -24
step "done"
