#!/usr/bin/env bash
# Twenty-fourth session, first call: kernels/nvfp4_m1.py (the one-row NVFP4 GEMV with scale groups in the MMA's
# columns and cp.async staging; the MoE experts at decode) - the GPU tests of it and of mma_gemv (whose decode_fp4
# now takes its tables as an argument), then quant_decode_sweep --sections m1: odd shapes against fp32 math, graph
# replays, both dense shapes over its configs beside mma_gemv's and Triton's, the experts at 1 and 8 tokens.
set -uo pipefail
source bench/gpu_env.sh
step "GPU tests"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_nvfp4_m1.py tests/kernels/test_mma_gemv.py 2>&1 | tail -15
step "m1 sweep"
timeout 420 python3 bench/quant_decode_sweep.py --sections m1 --out "$OUT" 2>&1 | tee "$OUT/s24_m1.log" \
  | grep -v "^  .*WRONG" | tail -80
grep -c WRONG "$OUT/s24_m1.log"
save_triton_cache
step "done"
