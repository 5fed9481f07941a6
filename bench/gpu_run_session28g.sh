#!/usr/bin/env bash
# Twenty-eighth session, seventh call: every block's marks of the one-token experts (bench/m1_timeline.py --raw) on the
# tree as it stands (x staged a block, no split), to see what the slow gate|up blocks share (SM, blocks on the SM,
# expert, row tile).
set -uo pipefail
source bench/gpu_env.sh
step "timeline raw"
timeout 120 python3 bench/m1_timeline.py --tokens 1 --raw "$OUT/s28g_timeline_raw.pt" --json "$OUT/s28g_timeline.json" > "$OUT/s28g_timeline.txt" 2>&1; head -6 "$OUT/s28g_timeline.txt"
step "done"
