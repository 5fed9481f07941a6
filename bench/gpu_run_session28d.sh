#!/usr/bin/env bash
# Twenty-eighth session, fourth call: `--sections m1x` again (the third call's filter had dropped every form but the
# defaults), new / base, and one-token block timelines with down_sum held to 2 blocks an SM, with and without 3
# stages.
set -uo pipefail
source bench/gpu_env.sh
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
for tree in new base; do
  src=$PWD/src; [ $tree = base ] && src=$PWD/.base_src/src
  step "m1x $tree"
  PYTHONPATH=/tmp/site:$src timeout 200 python3 bench/quant_decode_sweep.py --sections m1x --out "$OUT/s28d_m1x_$tree" 2>&1 | grep -E "MoE|  |Error|error" | tail -16
done
for v in "cap2:--down-cap 2" "st3cap2:--down-stages 3 --down-cap 2" "st3:--down-stages 3"; do
  step "timeline 1 token, ${v#*:}"
  timeout 120 python3 bench/m1_timeline.py --tokens 1 ${v#*:} --json "$OUT/s28d_timeline_${v%%:*}.json" 2>&1 | tee "$OUT/s28d_timeline_${v%%:*}.txt" | head -9
done
step "done"
