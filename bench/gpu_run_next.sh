#!/usr/bin/env bash
# One device call on nvidia-h200 (at most ~9.5 min: the step limits add up to 540 s): what the eighth session's code left unmeasured on a GPU.
# 1. the fused norms in bf16: the trained demo model's greedy tokens with both backends;
# 2. the lane-per-token mHC weights kernel and the indexer memo: kernels and time per decode step of the
#    demo model (decode_profile: `_hc_weights_kernel` took 9.2 us per call before);
# 3. adaptive k vs fixed k=3 in steady state at batch 1 (interleaved; adaptive trailed k=3 in two of
#    three `bench spec` passes with the fused norms, not understood);
# 4. the real-width KKKM decode step (batch 1 and 32) with a per-kernel profile;
# 5. each norm backend against float32 on the tiny checkpoints (slow on a fresh machine: last).
set -uo pipefail
source bench/gpu_env.sh
step "demo model bf16: norm triton vs torch"
timeout 100 python3 bench/backend_demo_tokens.py 2>&1 | grep -E "^\||Error|error"
step "demo model: kernels per decode step"
timeout 100 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 40 \
  2>&1 | grep -E "^\| (execute|draft|commit|_hc_weights_kernel|_rms_norm_kernel) |^#"
step "adaptive vs fixed k=3, batch 1, interleaved"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 6 2>&1 | tail -12
step "real-width KKKM decode"
timeout 90 python3 -m tpserve.cli bench model --device cuda --prefill 1024 --repeats 1 --decode-steps 32 \
  --batch 1 32 --profile 8 2>&1 | grep -E "^\||profile|Error|error"
step "tiny checkpoints: each norm backend against fp32"
timeout 130 python3 bench/gpu_check_tiny.py --norms --configs default,variant 2>&1 | grep -E "^\||Error|error"
save_triton_cache  # last: the tiny checks compile float32 variants a carried cache lacks
step "done"
