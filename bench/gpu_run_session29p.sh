#!/usr/bin/env bash
# Twenty-ninth session, sixteenth call: gate|up reading one of R copies of x (`experts`' x_copies, new; block b reads
# copy b % R: all 1024 blocks read x's 64 lines of L2 as they start) against x itself: `--sections m1rep` (new),
# R = 1, 4, 16, 64 at 1, 2 and 8 tokens; then nvfp4_m1's GPU test.
set -uo pipefail
source bench/gpu_env.sh
step "m1rep"
timeout 250 python3 bench/quant_decode_sweep.py --sections m1rep --out "$OUT/s29p_m1rep" 2>&1 | grep -E "MoE|  |Error|error" \
  | tail -20
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
timeout 100 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1.py -k "gpu" 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert" | tail -8
step "done"
