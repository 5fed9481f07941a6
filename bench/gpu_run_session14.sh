#!/usr/bin/env bash
# Fourteenth session, first call (~8 min):
# 1. the indexer's top-k: torch.topk, the single top_pools kernel and the chunked pair (parallel chunk sorts + one
#    merge; not yet timed) at 1 / 16 tokens and contexts 1k-128k; if the chunked pair beats torch.topk at every
#    context, --indexer-topk-backend triton can use it and become the default;
# 2. async scheduling (engine/overlap.py, new): real-width KKKM decode at batch 1, 32, 64 with it off and on (the
#    step time against the graph replayed alone), and batch 1 on with --indexer-topk-backend triton.
set -uo pipefail
source bench/gpu_env.sh
step "top-k over complete pools: single kernel and chunked pair vs torch.topk"
timeout 90 python3 bench/topk_pools.py --json "$OUT/topk_pools.json" 2>&1 | grep -E "^\||Error|error" | head -14
for a in no-async-scheduling async-scheduling; do
  step "real-width KKKM decode, --$a"
  timeout 120 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
    --decode-steps 48 --batch 1 32 64 --$a --json "$OUT/model_kkkm_$a.json" 2>&1 \
    | grep -E "^\| decode|Error|error|Traceback" | head -6
done
step "real-width KKKM decode batch 1, --async-scheduling --indexer-topk-backend triton"
timeout 70 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
  --decode-steps 48 --batch 1 --async-scheduling --indexer-topk-backend triton \
  --json "$OUT/model_kkkm_async_topk_triton.json" 2>&1 | grep -E "^\| decode|Error|error|Traceback" | head -4
save_triton_cache
step "done"
