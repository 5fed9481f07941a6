#!/usr/bin/env bash
# Fourteenth session, third call (~7 min):
# 1. --gemv-backend torch (the default, cuBLAS) against triton at decode batch 1, 8 and 16 (M <= 16 rows take the
#    Triton GEMV), now that merged linears give it wider weights; alternated twice (one process per run);
# 2. prefill 4k / 16k with and without merged linears (5 repeats each), and one prefill step's kernels by device
#    time (--profile-prefill, new): 16k with merged linears, 4k without.
set -uo pipefail
source bench/gpu_env.sh
for round in 1 2; do
  for g in torch triton; do
    step "real-width KKKM decode, --gemv-backend $g (round $round)"
    timeout 80 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
      --decode-steps 48 --batch 1 8 16 --gemv-backend $g --json "$OUT/model_kkkm_gemv_${g}_$round.json" 2>&1 \
      | grep -E "^\| decode|Error|error|Traceback" | head -4
  done
done
step "real-width KKKM prefill, --merge-linears, profile 16k"
timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 5 \
  --batch 1 --decode-steps 8 --profile-prefill 16384 --json "$OUT/model_kkkm_prefill_merged.json" 2>&1 \
  | grep -E "^\| (prefill|[^d-])|^device busy|Error|error|Traceback" | head -34
step "real-width KKKM prefill, --no-merge-linears, profile 4k"
timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 5 \
  --batch 1 --decode-steps 8 --no-merge-linears --profile-prefill 4096 --json "$OUT/model_kkkm_prefill_unmerged.json" \
  2>&1 | grep -E "^\| (prefill|[^d-])|^device busy|Error|error|Traceback" | head -34
save_triton_cache
step "done"
