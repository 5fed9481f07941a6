#!/usr/bin/env bash
# Fifteenth session, eighth call (~1 min): hc_project with 16 to 128 rows per program (the seventh call's 16 rows
# re-read the split weight, 2.3 MiB, once per 16 rows: 0.86 ms at 16k against a 0.125 ms floor).
# NOT RUN in the fifteenth session: its device time was spent; left for the next session.
set -uo pipefail
source bench/gpu_env.sh
step "prefill kernels at real widths, hc_project rows per program"
timeout 90 python3 bench/prefill_kernels.py --hc-block-t 16 32 64 128 --json "$OUT/prefill_kernels.json" 2>&1 \
  | grep -E "^\| hc|^hc_project|Error|error|Traceback" | head -16
step "done"
