#!/usr/bin/env bash
# Twenty-ninth session, fourth call: why the fused kernel streams at ~2 TB/s (third call: 69-112 us against
# nvfp4_m1's 40; more bytes in flight made it slower): L2 prefetch hints 0 / 128 / 256 and 16 warps x 3 stages
# (bench/m1_fused.py), then Nsight Compute on the fused kernel and on nvfp4_m1's two (DRAM bytes, L2 sectors,
# stall reasons).
set -uo pipefail
source bench/gpu_env.sh
step "m1_fused"
timeout 200 python3 bench/m1_fused.py --configs 12:6:1,12:6:1:0,12:6:1:128,16:3:1,16:3:1:0,8:6:1:0 --rounds 2 \
  --json "$OUT/s29d_fused.json" 2>&1 | grep -v "^fused Config" | tail -14
step "ncu"
METRICS='dram__bytes_read.sum,lts__t_sectors_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
timeout 200 ncu -k regex:'nvfp4_m1' --launch-skip 1 --launch-count 5 --section SpeedOfLight --section Occupancy \
  --metrics "$METRICS" python3 bench/m1_fused.py --configs 12:6:1 --ncu > "$OUT/s29d_ncu.txt" 2>&1
grep -E "tpserve_|==ERR|Duration|DRAM Throughput|dram__bytes|lts__t_sector|Achieved Occupancy|stalled_(long_scoreboard|barrier|membar|short_scoreboard|wait|math|no_inst|lg_throttle|mio|drain|sleeping|branch|dispatch|not_selected|selected|imc|tex)" "$OUT/s29d_ncu.txt" | head -90
step "done"
