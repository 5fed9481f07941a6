#!/usr/bin/env bash
# The next session's first device call (~7 min), prepared in the twelfth (no device time left):
# 1. boot with and without a processed-weight snapshot, real widths, one KDA layer (~16 GB checkpoint
#    written first): issue 11's "restore >= 3 GB/s per rank; boot time with and without" (never measured);
# 2. an A/A control for bench/spec_ab.py (fixed k=5 against fixed k=5: how far from 1.000 two identical
#    engines land; the adaptive / fixed medians were 0.972-0.992);
# 3. adaptive (k<=7) against fixed k=7 (k=7 was the best fixed k at batch 1: 1.015x of k=5);
# 4. batch 64 adaptive vs plain, 12 rounds (three 6-round medians were 1.025 / 0.989 / 0.963).
set -uo pipefail
source bench/gpu_env.sh
step "boot with and without a snapshot, real widths, one KDA layer"
timeout 330 python3 bench/boot_snapshot.py --layers K --dir /tmp/tpserve-boot --json "$OUT/boot_snapshot.json" \
  2>&1 | grep -vE "it/s\]|B/s\]" | tail -12
rm -rf /tmp/tpserve-boot
step "A/A: fixed k=5 vs fixed k=5, interleaved"
timeout 100 python3 bench/spec_ab.py --device cuda --batch 1 --k 5 --fixed-k 5 --max-tokens 96 --rounds 8 \
  --candidate fixed --json "$OUT/ab_fixed5_fixed5.json" 2>&1 | grep -E "^median|Error|error|Traceback"
step "batch 1: adaptive (k<=7) vs fixed k=7, interleaved"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 7 --max-tokens 96 --rounds 8 \
  --json "$OUT/ab_adaptive7_fixed7.json" 2>&1 | grep -E "^median|k per step|measured rates|Error|error|Traceback"
step "batch 64: adaptive (k<=5) vs off, interleaved"
timeout 100 python3 bench/spec_ab.py --device cuda --batch 64 --k 5 --max-tokens 96 --rounds 12 --baseline off \
  --json "$OUT/ab_b64_adaptive5_off.json" 2>&1 | grep -E "^median|k per step|Error|error|Traceback"
save_triton_cache
step "done"
