#!/usr/bin/env bash
# Fourteenth session, fifth call (~4 min): prefill after the conv_chunk / combine_sorted kernels: --mla-prefill
# sparse against the default dense at 4k and 16k (5 repeats each), with a kernel profile of each mode's 4k step.
set -uo pipefail
source bench/gpu_env.sh
for m in sparse dense; do
  step "real-width KKKM prefill, --mla-prefill $m, profile 4k"
  timeout 120 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 5 \
    --batch 1 --decode-steps 8 --mla-prefill $m --profile-prefill 4096 --json "$OUT/model_kkkm_prefill_$m.json" \
    2>&1 | grep -E "^\| |^device busy|Error|error|Traceback" | head -22
done
save_triton_cache
step "done"
