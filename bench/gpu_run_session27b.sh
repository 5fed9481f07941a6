#!/usr/bin/env bash
# Twenty-seventh session, second call: Nsight Compute on mma_gemv's FP8 GEMV, 4096 x 12288 at 8 rows: the register
# loads (default config) against bulk copies (stage "bulk", one row tile, 8 consumer warps, 4 slots of 8 chunks;
# 2 slots of 16), which the first call (s27) measured 17.5-18.0 us against 15.0: why.
set -uo pipefail
source bench/gpu_env.sh
run_ncu() {  # name, then bench/ncu_quant.py's arguments
  step "ncu $1"; local name=$1; shift
  timeout 120 ncu -k regex:'tpserve_' --launch-skip 2 --launch-count 1 --set full python3 bench/ncu_quant.py "$@" \
    > "$OUT/s27b_ncu_$name.txt" 2>&1
  grep -E "rel err|ERR_|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit|Warp Cycles Per Issued|L2 Hit Rate|L1/TEX Hit|Mem Busy|Max Bandwidth|Waves Per SM|Shared Memory Configuration Size|Dynamic Shared" "$OUT/s27b_ncu_$name.txt" | head -34
  grep -iE "stall|pipe.*%|utiliz|bank" "$OUT/s27b_ncu_$name.txt" | head -16
}
run_ncu fp8_regs mma-fp8 1 8 2 8 0 4096 12288
run_ncu fp8_bulk_d4s8 mma-fp8 1 8 4 8 2 4096 12288 8
run_ncu fp8_bulk_d2s16 mma-fp8 1 8 2 8 2 4096 12288 16
step "done"
