#!/usr/bin/env bash
# Twenty-eighth session, first call: where nvfp4_m1's one-token MoE experts lose against their floor (62-67%, while
# gate|up at 8 tokens streams at 81%). Block timelines (bench/m1_timeline.py: each block's start, x staged and K
# loop end from %globaltimer, at 1 and 8 tokens) and Nsight Compute's stall reasons and pipe use for gate|up and
# down_sum at one token and gate|up at 8.
set -uo pipefail
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
step "timeline"
python3 bench/m1_timeline.py --tokens 1 8 --json "$OUT/s28_timeline.json" 2>&1 | tee "$OUT/s28_timeline.txt"
METRICS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active,regex:sm__pipe_.*_cycles_active\.avg\.pct_of_peak_sustained_active'
run_ncu() {  # name, tokens, launches to skip, launches to profile
  step "ncu $1"
  timeout 150 ncu -k regex:'nvfp4_m1' --launch-skip "$3" --launch-count "$4" --set full --metrics "$METRICS" \
    python3 bench/m1_timeline.py --ncu --tokens "$2" > "$OUT/s28_ncu_$1.txt" 2>&1
  grep -E "tpserve_|==ERR|Duration|DRAM Throughput|Compute \(SM\) Throughput|Issue Slots Busy|Active Warps Per Scheduler|Eligible Warps Per Scheduler|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Warp Cycles Per Issued|L2 Hit Rate|Mem Busy|Max Bandwidth|Waves Per SM" "$OUT/s28_ncu_$1.txt" | head -40
  grep -E "stalled|pipe_" "$OUT/s28_ncu_$1.txt" | awk '$NF+0 > 0.05' | head -60
}
run_ncu t1 1 4 2
run_ncu t8 8 4 1
step "done"
