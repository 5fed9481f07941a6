#!/usr/bin/env bash
# Twenty-first session, fourth call (~3 min): Nsight Compute on the nibble-planes kernel (12288 x 4096), which like
# every NVFP4 GEMV before it runs at ~18-20 us whatever its instruction count (4.2 SASS a weight here; tiled weights
# gained 1-1.6 us, whole-row K tiles nothing): wgmma (64 x 256, 4 warps, waits after each dot) and mma.sync
# (32 x 256, one warp) at one row and at 8. Reports as text in $OUT/ncu_*.txt, a digest printed.
set -uo pipefail
source bench/gpu_env.sh
run_ncu() {  # name, then bench/ncu_quant.py's arguments
  local name=$1; shift
  timeout 150 ncu -k regex:'_nvfp4_planes' --launch-skip 2 --launch-count 1 --set full \
    python3 bench/ncu_quant.py "$@" > "$OUT/ncu_$name.txt" 2>&1
  echo "--- $name ($*)"
  grep -E "rel err|ERR_|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Block Limit|Warp Cycles Per Issued|L2 Hit Rate|Waves Per SM|SM Frequency|DRAM Frequency|Stall|stall" "$OUT/ncu_$name.txt" | head -45
}
step "ncu: planes wgmma 64 x 256, 4 warps, 3 stages, 2 waves, M=1"; run_ncu planes_wg nvfp4-planes 64 256 4 3 2
step "ncu: planes mma.sync 32 x 256, 1 warp, 3 stages, 2 waves, M=1"; run_ncu planes_mma nvfp4-planes 32 256 1 3 2
step "ncu: planes wgmma 64 x 256, M=8"; run_ncu planes_wg8 nvfp4-planes 64 256 4 3 2 8
step "done"
