#!/usr/bin/env bash
# Sixteenth session, second call (~8 min): (1) issue 12 at batch 64 after the idle fix (the first call measured
# the adaptive engine at k = 0 on 100% of steps 0.914x of no speculation: those steps went through the
# speculator, without async scheduling); (2) batch 1 adaptive (k <= 7) vs fixed k = 7 on one engine, 24 rounds;
# (3) real-width KKKM prefill 4k / 16k and decode 1 / 32 / 64 with hc_project at 128 rows per program (the new
# default; 0.245 vs 0.860 ms a call at 16k in the first call); (4) the bf16 grouped MoE prefill (issue 11's
# 60% MFU goal at 16k; last measured 41% in the first sessions, before the Triton combine).
set -uo pipefail
source bench/gpu_env.sh
step "batch 64: adaptive (k<=7) vs no speculation"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 64 --k 7 --max-tokens 96 --rounds 6 --baseline off \
  --json "$OUT/spec_ab_b64_k7_off.json" 2>&1 | grep -E "^median|k per step|measured rates|Error|error|Traceback"
step "batch 1: adaptive (k<=7) vs fixed k=7, one engine"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 7 --max-tokens 96 --rounds 24 --one-engine \
  --json "$OUT/spec_ab_b1_k7_one.json" 2>&1 | grep -E "^median|k per step|measured rates|Error|error|Traceback"
step "real-width KKKM prefill 4k / 16k, decode 1 / 32 / 64"
timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 5 \
  --batch 1 32 64 --decode-steps 16 --json "$OUT/model_kkkm.json" 2>&1 \
  | grep -E "^\| (prefill|decode)|Error|error|Traceback" | head -8
step "bf16 grouped MoE prefill"
timeout 110 python3 bench/quant_kernels.py --sections moe --out "$OUT" 2>&1 | grep -E "^\||Error|error|Traceback" | head -20
save_triton_cache
step "done"
