#!/usr/bin/env bash
# Twenty-fourth session, third call: kernels/nvfp4_m1.py with x staged in shared memory and a second decode
# ("shift": shifts and masks, 28% fewer ALU-pipe operations than the prmt tables; the second call's Nsight Compute
# found the NVFP4 kernels bound by the ALU pipe, not DRAM). GPU tests (both decodes: "shift" is exact only if the
# tensor cores keep bf16 subnormal inputs), then quant_decode_sweep --sections m1 (lut and shift configs).
set -uo pipefail
source bench/gpu_env.sh
step "GPU tests"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_nvfp4_m1.py tests/kernels/test_mma_gemv.py 2>&1 | tail -6
step "m1 sweep"
timeout 360 python3 bench/quant_decode_sweep.py --sections m1 --out "$OUT" 2>&1 | tee "$OUT/s24c_m1.log" \
  | grep -v "^  .*WRONG" | tail -70
grep -c WRONG "$OUT/s24c_m1.log"
save_triton_cache
step "done"
