#!/usr/bin/env bash
# Twenty-fifth session, third call: mma_gemv with W staged through shared memory (Config.stage "smem", cp.async)
# against its register loads: the GPU tests of tests/kernels/test_mma_gemv.py (smem bit for bit the regs form), then
# quant_decode_sweep --sections mmasmem (FP8 and NVFP4, both shapes, 1 / 2 / 4 / 8 rows, 24 smem configs each,
# beside the defaults).
set -uo pipefail
source bench/gpu_env.sh
step "GPU test"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mma_gemv.py 2>&1 | tail -4
step "mmasmem"
timeout 450 python3 bench/quant_decode_sweep.py --sections mmasmem --out "$OUT" 2>&1 | tee "$OUT/s25c_mmasmem.log" \
  | grep -v "^  .*WRONG" | tail -120
step "done"
