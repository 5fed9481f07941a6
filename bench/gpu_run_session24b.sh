#!/usr/bin/env bash
# Twenty-fourth session, second call: the experts kernels again after the fix of `limit` (torch's launcher passes a
# Python float as a double; the kernel read a float, so limit was 0 and every output 0: the first call's "WRONG"),
# the GPU test, quant_decode_sweep --sections m1, then Nsight Compute on 12288 x 4096: mma_gemv's NVFP4 default at
# one row, nvfp4_m1 at two configs, and mma_gemv's FP8 default at 8 rows (81% of its floor) for comparison.
set -uo pipefail
source bench/gpu_env.sh
step "GPU test"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_nvfp4_m1.py 2>&1 | tail -4
step "m1 sweep"
timeout 300 python3 bench/quant_decode_sweep.py --sections m1 --out "$OUT" 2>&1 | tee "$OUT/s24b_m1.log" \
  | grep -v "^  .*WRONG" | tail -60
grep -c WRONG "$OUT/s24b_m1.log"
run_ncu() {  # name, then bench/ncu_quant.py's arguments
  local name=$1; shift
  timeout 120 ncu -k regex:'tpserve_' --launch-skip 2 --launch-count 1 --set full python3 bench/ncu_quant.py "$@" \
    > "$OUT/ncu_$name.txt" 2>&1
  echo "--- $name ($*)"
  grep -E "rel err|ERR_|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit|Warp Cycles Per Issued|L2 Hit Rate|Mem Busy|Max Bandwidth" "$OUT/ncu_$name.txt" | head -30
  grep -iE "stall|pipe.*%|utiliz" "$OUT/ncu_$name.txt" | head -14
}
step "ncu"
run_ncu mma_nvfp4_m1 mma-nvfp4 2 4 2 1
run_ncu m1_r2s4st2 m1 2 4 2 256
run_ncu m1_r1s8st4 m1 1 8 4 256
run_ncu mma_fp8_m8 mma-fp8 2 4 2 8
save_triton_cache
step "done"
