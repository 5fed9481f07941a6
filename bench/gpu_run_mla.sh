#!/usr/bin/env bash
# One device call on nvidia-h200 (~7 min): the sparse MLA kernel (`--mla-decode-backend triton`, the new
# auto on cuda) against the torch form: the kernel alone at real widths, greedy tokens of the demo model
# (bf16) and the tiny checkpoints (fp32), kernels per decode step, real-width decode A/B, bench spec.
set -uo pipefail
source bench/gpu_env.sh
step "sparse MLA kernel vs torch form (64 heads, latent 512, selection 2051, bf16; graph replays)"
timeout 120 python3 bench/mla_sparse_bench.py --tokens 1 8 32 64 --json "$OUT/mla_sparse.json" 2>&1 | grep -E "^\||Error|error"
step "demo model greedy tokens, mla_decode_backend triton vs torch (bf16)"
timeout 90 python3 bench/backend_demo_tokens.py --switch mla_decode_backend 2>&1 | grep -E "^\||Error|error"
step "tiny checkpoints fp32, mla_decode_backend triton vs torch"
timeout 120 python3 bench/gpu_check_tiny.py --norms --switch mla_decode_backend --fp32-only 2>&1 | grep -E "^\||Error|error" | tail -8
for b in triton torch; do
  step "demo model kernels per step, mla_decode_backend=$b"
  timeout 80 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 5 \
    --set mla_decode_backend=$b --json "$OUT/profile_mla_$b.json" 2>&1 | grep -E "^\| (execute|draft|commit) |^##"
done
for b in triton torch; do
  step "real-width KKKMKKKM decode, mla_decode_backend=$b"
  timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --prefill 1024 --repeats 1 \
    --decode-steps 32 --batch 1 32 64 --mla-decode-backend $b --json "$OUT/model_kkkmkkkm_mla_$b.json" 2>&1 | grep -E "^\| (decode|prefill)|Error|error"
done
step "bench spec, batch 1 (draft chain, sparse MLA kernel)"
timeout 100 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 \
  --json "$OUT/spec_mla.json" 2>&1 | grep -E "^\| 1 |Error|error"
save_triton_cache
step "done"
