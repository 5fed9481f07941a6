#!/usr/bin/env bash
# Twenty-eighth session, tenth call: block timelines of the one-token experts with down_sum on per-pair readiness
# counts (`--ready`; ninth call: 44.0 us against 40.1) and without, every block's marks saved (--raw).
set -uo pipefail
source bench/gpu_env.sh
for v in "plain:" "ready:--ready"; do
  step "timeline ${v%%:*}"
  timeout 120 python3 bench/m1_timeline.py --tokens 1 ${v#*:} --raw "$OUT/s28j_raw_${v%%:*}.pt" --json "$OUT/s28j_timeline_${v%%:*}.json" > "$OUT/s28j_timeline_${v%%:*}.txt" 2>&1
  head -8 "$OUT/s28j_timeline_${v%%:*}.txt"
done
step "done"
