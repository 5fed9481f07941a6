#!/usr/bin/env bash
# Twenty-ninth session, thirteenth call: Nsight Compute on the block-item fused kernel (twelfth call: 73 us; a warp
# takes ~5.5 us a task of 4.6 KB, where nvfp4_m1.s gate|up warps take ~2.5-3): the same metrics as the ninth call.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "ncu"
METRICS='sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__warps_active.avg.per_cycle_active,smsp__warps_eligible.avg.per_cycle_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed_op_shared_ld.sum,dram__bytes_read.sum,gpu__time_duration.sum,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
timeout 200 ncu -k regex:'nvfp4_m1' --launch-skip 1 --launch-count 1 --metrics "$METRICS" \
  python3 bench/m1_fused.py --configs 16:2:1 --ncu > "$OUT/s29m_ncu.txt" 2>&1
grep -E "tpserve_|==ERR|inst_executed|issue_active|warps_active|warps_eligible|bank_conflicts|dram__bytes|duration|pipe_alu|pipe_fma|stalled_(long_scoreboard|barrier|membar|short_scoreboard|wait|math|no_inst|lg_throttle|mio|branch|dispatch|not_selected|sleeping)" "$OUT/s29m_ncu.txt" | head -80
step "done"
