#!/usr/bin/env bash
# One device call on nvidia-h200 (~6 min): the indexer's decode scores read from the paged pool cache in
# one kernel (`--indexer-backend triton`, auto on cuda) against the torch form: greedy tokens (demo bf16,
# tiny fp32), kernels per step, real-width decode A/B, bench spec; and the sparse MLA kernel's range split.
set -uo pipefail
source bench/gpu_env.sh
step "demo model greedy tokens, indexer_backend triton vs torch (bf16)"
timeout 90 python3 bench/backend_demo_tokens.py --switch indexer_backend 2>&1 | grep -E "^\||Error|error"
step "tiny checkpoints fp32, indexer_backend triton vs torch"
timeout 120 python3 bench/gpu_check_tiny.py --norms --switch indexer_backend --fp32-only 2>&1 | grep -E "^\||Error|error" | tail -6
for b in triton torch; do
  step "demo model kernels per step, indexer_backend=$b"
  timeout 80 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 8 \
    --set indexer_backend=$b --json "$OUT/profile_idx_$b.json" 2>&1 | grep -E "^\| (execute|draft|commit) |^##"
done
for b in triton torch; do
  step "real-width KKKMKKKM decode, indexer_backend=$b"
  timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --prefill 1024 --repeats 1 \
    --decode-steps 32 --batch 1 32 64 --indexer-backend $b --json "$OUT/model_kkkmkkkm_idx_$b.json" 2>&1 | grep -E "^\| decode|Error|error"
done
step "bench spec, batch 1"
timeout 100 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 \
  --json "$OUT/spec_idx.json" 2>&1 | grep -E "^\| 1 |Error|error"
step "sparse MLA kernel: range split at 1 and 8 tokens"
timeout 90 python3 bench/mla_sparse_bench.py --tokens 1 8 --ranges 4 8 16 32 65 --json "$OUT/mla_ranges.json" 2>&1 | grep -E "^\||ranges|Error|error"
save_triton_cache
step "done"
