#!/usr/bin/env bash
# One device call on nvidia-h200 (~4 min): the indexer decode-score kernel after its first measurement
# (bench/gpu_run_indexer_scores.sh: slower than torch at real width) gained an early exit for blocks of
# pools not complete yet and 16-bit tensor-core dots; the sparse MLA kernel's ranges stop at two waves.
set -uo pipefail
source bench/gpu_env.sh
step "demo model greedy tokens, indexer_backend triton vs torch (bf16)"
timeout 90 python3 bench/backend_demo_tokens.py --switch indexer_backend 2>&1 | grep -E "^\||Error|error"
step "demo model kernels per step (all defaults)"
timeout 80 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 8 \
  --json "$OUT/profile_idx2.json" 2>&1 | grep -E "^\| (execute|draft|commit) |^##"
for b in triton torch; do
  step "real-width KKKMKKKM decode, indexer_backend=$b"
  timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --prefill 1024 --repeats 1 \
    --decode-steps 32 --batch 1 32 64 --indexer-backend $b --json "$OUT/model_kkkmkkkm_idx2_$b.json" 2>&1 | grep -E "^\| decode|Error|error"
done
step "sparse MLA kernel (ranges up to two waves)"
timeout 90 python3 bench/mla_sparse_bench.py --tokens 1 8 32 64 --json "$OUT/mla_sparse2.json" 2>&1 | grep -E "^\||Error|error"
step "bench spec, batch 1"
timeout 100 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 \
  --json "$OUT/spec_idx2.json" 2>&1 | grep -E "^\| 1 |Error|error"
save_triton_cache
step "done"
