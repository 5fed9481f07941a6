#!/usr/bin/env bash
# Twenty-eighth session, fifth call: `--sections m1x` with the tree before's nvfp4_m1 in the same process
# (M1X_BASE), three alternations of 40-call graphs: x's chunk in the stages against x staged a block, down_sum held
# to 2 blocks an SM at one token, gate|up held to 8 or 9 blocks an SM at 2 and 8 tokens. Twice.
set -uo pipefail
source bench/gpu_env.sh
for run in 1 2; do
  step "m1x ($run)"
  M1X_BASE=$PWD/.base_src/src/tpserve/kernels/nvfp4_m1.py timeout 280 python3 bench/quant_decode_sweep.py \
    --sections m1x --out "$OUT/s28e_m1x_$run" 2>&1 | grep -E "MoE|  |Error|error" | tail -16
done
step "done"
