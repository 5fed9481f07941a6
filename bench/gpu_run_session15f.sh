#!/usr/bin/env bash
# Fifteenth session, sixth call (~4 min): --mla-prefill dense vs sparse at 4k and 8k tokens after the sparse
# kernel's prefill shape (the auto threshold, 8,192 positions, was measured with the old shape), alternated.
set -uo pipefail
source bench/gpu_env.sh
for round in 1 2; do
  for m in dense sparse; do
    step "real-width KKKM prefill 4k / 8k, --mla-prefill $m, round $round"
    timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 8192 --repeats 5 \
      --batch 1 --decode-steps 4 --mla-prefill $m --json "$OUT/model_prefill_${m}_$round.json" 2>&1 \
      | grep -E "^\| prefill|Error|error|Traceback" | head -4
  done
done
step "done"
