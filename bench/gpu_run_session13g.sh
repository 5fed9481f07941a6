#!/usr/bin/env bash
# Thirteenth session, seventh call (~2.5 min, the session's last device minutes): the indexer's decode top-k over
# complete pools only (kernels/indexer_triton.top_pools, --indexer-topk-backend)
# 1. against torch.topk over all 8,192 pools: chosen pools checked, time per call at 1 and 16 tokens;
# 2. real-width KKKM decode at batch 1 with --indexer-topk-backend torch, then triton.
set -uo pipefail
source bench/gpu_env.sh
step "top-k over complete pools vs torch.topk"
timeout 50 python3 bench/topk_pools.py --json "$OUT/topk_pools.json" 2>&1 | grep -E "^\||Error|error" | head -14
for b in torch triton; do
  step "real-width KKKM decode, --indexer-topk-backend $b"
  timeout 55 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
    --decode-steps 32 --batch 1 --indexer-topk-backend $b --json "$OUT/model_kkkm_topk_$b.json" 2>&1 \
    | grep -E "^\| decode|Error|error" | head -4
done
step "done"
