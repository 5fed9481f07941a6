#!/usr/bin/env bash
# Twenty-fifth session, fifth call: Nsight Compute on mma_gemv's FP8 GEMV, 4096 x 12288 at one row, register loads
# (the default config: one row tile, 8 warps, depth 2) against W through shared memory (stage "smem", depth 2 and
# 3): why the smem form measured slower (s25c).
set -uo pipefail
source bench/gpu_env.sh
run_ncu() {  # name, then bench/ncu_quant.py's arguments
  step "ncu $1"; local name=$1; shift
  timeout 120 ncu -k regex:'tpserve_' --launch-skip 2 --launch-count 1 --set full python3 bench/ncu_quant.py "$@" \
    > "$OUT/s25e_ncu_$name.txt" 2>&1
  grep -E "rel err|ERR_|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit|Warp Cycles Per Issued|L2 Hit Rate|Mem Busy|Max Bandwidth" "$OUT/s25e_ncu_$name.txt" | head -30
  grep -iE "stall|pipe.*%|utiliz" "$OUT/s25e_ncu_$name.txt" | head -14
}
run_ncu fp8_regs_d2 mma-fp8 1 8 2 1 0 4096 12288
run_ncu fp8_smem_d2 mma-fp8 1 8 2 1 1 4096 12288
run_ncu fp8_smem_d4 mma-fp8 1 8 4 1 1 4096 12288
step "done"
