#!/usr/bin/env bash
# Twenty-fifth session, eleventh call: mma_gemv with two blocks a row tile (Config.ksplit 2: a thread-block cluster
# over K, sums through distributed shared memory). GPU tests of tests/kernels/test_mma_gemv.py and
# test_nvfp4_m1.py (kernels/launch_ex.py, renamed from pdl.py); quant_decode_sweep --sections mmaksplit. Slower
# everywhere: the option, its cluster launch and the section were removed in the next commit (they are at befa38b,
# where this script runs as it ran).
set -uo pipefail
source bench/gpu_env.sh
step "GPU tests"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mma_gemv.py tests/kernels/test_nvfp4_m1.py \
  2>&1 | tail -15
step "mmaksplit"
timeout 300 python3 bench/quant_decode_sweep.py --sections mmaksplit --out "$OUT" 2>&1 | tee "$OUT/s25j_mmaksplit.log" \
  | grep -v "^  .*WRONG" | tail -80
step "done"
