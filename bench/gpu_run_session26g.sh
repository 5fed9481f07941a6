#!/usr/bin/env bash
# Twenty-sixth session, seventh call: the GPU tests at the final tree (PDL kernels bit for bit, PTX order, greedy
# tokens with --pdl on and off; mma_gemv under PDL; nvfp4_m1), pytest's own summary unfiltered.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>&1 | tail -2
step "GPU tests"
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_pdl.py tests/kernels/test_mma_gemv.py \
  tests/kernels/test_nvfp4_m1.py 2>&1 | tail -8
step "done"
