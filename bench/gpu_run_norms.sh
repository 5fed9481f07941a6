#!/usr/bin/env bash
# One device call on nvidia-h200 (~8 min with a carried Triton cache): the fused norm kernels
# (--norm-backend triton, kernels/norm_triton.py) against the torch forms: greedy tokens on the tiny
# checkpoints (fp32, bf16), kernels per decode step of the demo model, `bench spec` at batch 1 with
# each backend (plain and k=3 decode tok/s), and the real-width KKKM decode step with each backend.
# (In the 2026-12-02 run recorded in BENCHMARKS.md, `bench spec` still dropped --norm-backend, so its
# passes all ran the fused norms; fixed since.)
set -uo pipefail
source bench/gpu_env.sh
step "tiny checkpoints: norm triton vs torch"
timeout 150 python3 bench/gpu_check_tiny.py --norms --configs default,variant 2>&1 | tee "$OUT/norms_tiny.log" \
  | grep -E "^\||Error|error"
step "demo model: kernels per decode step with the fused norms"
timeout 90 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 30 \
  --json "$OUT/decode_profile_norms.json" 2>&1 | tee "$OUT/decode_profile_norms.log" | grep -E "^\| (execute|draft|commit) |^#"
for nb in triton torch; do
  step "bench spec, batch 1, norm-backend $nb"
  timeout 100 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 --norm-backend $nb \
    --json "$OUT/spec_norm_$nb.json" 2>&1 | tee "$OUT/spec_norm_$nb.log" | grep -E "^\||Error|error"
done
for nb in triton torch; do
  step "real-width KKKM decode, norm-backend $nb"
  timeout 110 python3 -m tpserve.cli bench model --device cuda --prefill 1024 --repeats 1 --decode-steps 32 \
    --batch 1 32 --norm-backend $nb --json "$OUT/model_kkkm_norm_$nb.json" 2>&1 | tee "$OUT/model_kkkm_norm_$nb.log" \
    | grep -E "^\||Error|error"
done
save_triton_cache
step "done"
