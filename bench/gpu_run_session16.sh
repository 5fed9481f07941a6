#!/usr/bin/env bash
# Sixteenth session, first call (~9 min): (1) hc_project with 16 to 128 rows per program (the fifteenth
# session's 16 rows re-read the split weight once per 16 rows: 0.86 ms at 16k against a 0.125 ms floor);
# (2) issue 12: adaptive (k <= 7) against fixed k = 7 (the best fixed k at batch 1, twelfth session) on ONE
# engine switched between rounds (two engines differed by up to 6%), 16 rounds; batch 64 adaptive against no
# speculation; (3) issue 10: real-width KKKM prefill 4k with the Triton MoE up to 4,096 tokens against the
# default (grouped_mm above 2,048), one process each.
set -uo pipefail
source bench/gpu_env.sh
step "prefill kernels at real widths, hc_project rows per program"
timeout 90 python3 bench/prefill_kernels.py --hc-block-t 16 32 64 128 --json "$OUT/prefill_kernels.json" 2>&1 \
  | grep -E "^\| hc|^hc_project|Error|error|Traceback" | head -16
step "batch 1: adaptive (k<=7) vs fixed k=7, one engine"
timeout 170 python3 bench/spec_ab.py --device cuda --batch 1 --k 7 --max-tokens 96 --rounds 16 --one-engine \
  --json "$OUT/spec_ab_b1_k7_one.json" 2>&1 | grep -E "^median|k per step|measured rates|Error|error|Traceback"
step "batch 64: adaptive (k<=7) vs no speculation"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 64 --k 7 --max-tokens 96 --rounds 6 --baseline off \
  --json "$OUT/spec_ab_b64_k7_off.json" 2>&1 | grep -E "^median|k per step|measured rates|Error|error|Traceback"
for m in 2048 4096; do
  step "real-width KKKM prefill 4k, --moe-triton-max-tokens $m"
  timeout 70 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 --repeats 5 \
    --batch 1 --decode-steps 4 --moe-triton-max-tokens $m --json "$OUT/model_4k_moe_$m.json" 2>&1 \
    | grep -E "^\| (prefill|decode)|Error|error|Traceback" | head -4
done
save_triton_cache
step "done"
