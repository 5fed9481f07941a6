#!/usr/bin/env bash
# One device call for the next session (~7 min): what the eleventh session changed after its device time ran out.
# 1. batch 64, adaptive vs plain interleaved (early exit above the verify graphs; `_fill` table-row cache:
#    290 -> 100 us per batch-64 decode fill on a CPU); 10 rounds (median 0.970 before);
# 2. batch 64 plain decode through bench spec (the fill change; 48,851 tok/s in the eleventh session);
# 3. batch 1: fixed k=3 vs plain, 8 rounds (1.787x), adaptive vs fixed, 6 rounds (0.980; choose_k memory,
#    rarer probes since);
# 4. real-width KKKM decode batch 1 / 32 / 64 (1.956 / 8.836 / 12.028 ms) and prefill 4k dense vs sparse (16k:
#    sparse 259.0 vs dense 273.3 ms; 4k decides the default).
set -uo pipefail
source bench/gpu_env.sh
step "batch 64: adaptive vs off, interleaved"
timeout 200 python3 bench/spec_ab.py --device cuda --batch 64 --k 3 --max-tokens 96 --rounds 10 --baseline off \
  2>&1 | grep -E "^\| [0-9]|^median|k per step|Error|error|Traceback"
step "bench spec batch 64, off only"
timeout 100 python3 -m tpserve.cli bench spec --device cuda --batch 64 --k 3 --no-fixed --max-tokens 96 --repeats 3 \
  --json "$OUT/spec_b64.json" 2>&1 | grep -E "^\| 64 |Error|error|Traceback"
step "batch 1: fixed k=3 vs off, interleaved"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 8 --baseline off \
  --candidate fixed 2>&1 | grep -E "^median|k per step|Error|error|Traceback"
step "batch 1: adaptive vs fixed k=3, interleaved"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 6 \
  2>&1 | grep -E "^median|k per step|Error|error|Traceback"
step "real-width KKKM decode"
timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
  --decode-steps 32 --batch 1 32 64 --json "$OUT/model_kkkm.json" 2>&1 | grep -E "^\| (decode|prefill)|Error|error"
for mode in dense sparse; do
  step "real-width KKKM prefill 4k, mla_prefill=$mode"
  timeout 80 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 --repeats 2 \
    --decode-steps 0 --batch --mla-prefill $mode --json "$OUT/prefill4k_$mode.json" 2>&1 | grep -E "^\| prefill|Error|error"
done
save_triton_cache
step "done"
