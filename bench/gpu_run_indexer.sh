#!/usr/bin/env bash
# One device call on nvidia-h200 (~6 min; step limits add up to 540 s): the indexer's pool compression
# in one kernel (--indexer-backend), the k-choice sum of the grouped MoE in one kernel (under
# --moe-route-backend) and fla's decode output no longer zero-filled, checked and measured:
# 1. greedy tokens: demo model bf16 (indexer triton vs torch), tiny checkpoints fp32;
# 2. speculative decoding still exact with every default on (fp32, bf16; graphs);
# 3. kernels per decode step of the demo model, indexer torch / triton (the rest at its defaults);
# 4. real-width KKKM decode batch 1 and 32, indexer torch / triton; the remaining launch sites.
set -uo pipefail
source bench/gpu_env.sh
step "demo model bf16: indexer triton vs torch"
timeout 80 python3 bench/backend_demo_tokens.py --switch indexer_backend 2>&1 | grep -E "^\||Error|error"
step "speculative decoding exact with the defaults (fp32, bf16; graphs)"
timeout 150 python3 bench/gpu_check_spec.py --max-tokens 64 2>&1 | grep -E "^\||Error|error"
step "demo model: kernels per decode step, indexer torch / triton"
for b in torch triton; do
  timeout 70 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 60 \
    --set indexer_backend=$b --json "$OUT/profile_indexer_$b.json" 2>&1 | grep -E "^\| (execute|draft|commit) |^##"
done
step "real-width KKKM decode, indexer torch / triton"
for b in torch triton; do
  timeout 70 python3 -m tpserve.cli bench model --device cuda --prefill 1024 --repeats 1 --decode-steps 32 \
    --batch 1 32 --indexer-backend $b 2>&1 | grep -E "^\| (prefill|decode)|Error|error" | sed "s/^/$b /"
done
step "tiny checkpoints fp32: indexer triton vs torch"
timeout 60 python3 bench/gpu_check_tiny.py --norms --switch indexer_backend --fp32-only --configs default,variant \
  2>&1 | grep -E "^\| (default|variant)|Error|error"
save_triton_cache
step "done"
