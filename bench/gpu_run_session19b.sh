#!/usr/bin/env bash
# Nineteenth session, second call (~3 min): Nsight Compute on the decode GEMVs (12288 x 4096). The first call found
# the NVFP4 GEMV at one row at 18.3-18.6 us whatever its instruction count (one-row kernel 6.7 SASS instructions a
# weight, qtile B 5.9, qtile A 4.1), the FP8 one-row kernel at 14.6 us (80%): where do the NVFP4 kernels wait
# (issue stalls, pipe use, occupancy, DRAM throughput)? Reports as text in $OUT/ncu_*.txt, a digest printed.
set -uo pipefail
source bench/gpu_env.sh
run_ncu() {  # name, then bench/ncu_quant.py's arguments
  local name=$1; shift
  timeout 150 ncu -k regex:'_nvfp4_row|_gemv_kernel|_fp8_row' --launch-skip 2 --launch-count 1 --set full \
    --print-details all python3 bench/ncu_quant.py "$@" > "$OUT/ncu_$name.txt" 2>&1 \
    || timeout 150 ncu -k regex:'_nvfp4_row|_gemv_kernel|_fp8_row' --launch-skip 2 --launch-count 1 --set full \
         python3 bench/ncu_quant.py "$@" > "$OUT/ncu_$name.txt" 2>&1
  echo "--- $name ($*)"
  grep -E "rel err|ERR_|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Issued Ipc Active|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Shared Memory Configuration Size|Block Limit|Warp Cycles Per Issued|Executed Ipc|L2 Hit Rate|L1/TEX Hit|Waves Per SM|Mem Busy|Max Bandwidth|Stall|stall|pipe|Pipe" "$OUT/ncu_$name.txt" | head -60
}
step "ncu: NVFP4 one-row kernel 32 x 512, 4 warps, 1 stage, 2 waves"; run_ncu nvfp4_row nvfp4-row 32 512 4 1 2
step "ncu: NVFP4 qtile B 32 x 512, 4 warps, 3 stages"; run_ncu nvfp4_qb nvfp4-qb 32 512 4 3 0
step "ncu: NVFP4 qtile A 64 x 256, 4 warps, 3 stages"; run_ncu nvfp4_qa nvfp4-qa 64 256 4 3 0
step "ncu: FP8 one-row kernel (the default, 80%)"; run_ncu fp8_row fp8-row 16 512 8 3 2
step "ncu: FP8 M = 8 qtile B 32 x 128, 4 warps, 4 stages"; run_ncu fp8_qb fp8-qb 32 128 4 4 2
step "done"
