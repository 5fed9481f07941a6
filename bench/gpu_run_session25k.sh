#!/usr/bin/env bash
# Twenty-fifth session, twelfth call: the GPU tests of kernels/nvfp4_m1.py and mma_gemv.py at the final tree
# (down's arguments now prepared before gate|up's launch; the two-block K split removed).
set -uo pipefail
source bench/gpu_env.sh
step "GPU tests"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_nvfp4_m1.py tests/kernels/test_mma_gemv.py \
  2>&1 | tail -6
step "done"
