#!/usr/bin/env bash
# One device call on nvidia-h200 (~8 min): what the eighth session's code left unmeasured on a GPU.
# 1. the fused norms in bf16: each backend against float32 on the tiny checkpoints, and the trained demo
#    model's greedy tokens with both backends; 2. the lane-per-token mHC weights kernel: its time per call
#    inside the demo model's decode graph (decode_profile: `_hc_weights_kernel`, 9.2 us per call before);
#    3. the real-width KKKM decode step (batch 1 and 32) with it.
set -uo pipefail
source bench/gpu_env.sh
step "demo model bf16: norm triton vs torch"
timeout 120 python3 bench/norm_demo_tokens.py 2>&1 | grep -E "^\||Error|error"
step "demo model: kernels per decode step"
timeout 120 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 12 \
  2>&1 | grep -E "^\| (execute|draft|commit|_hc_weights_kernel|_rms_norm_kernel) |^#"
step "real-width KKKM decode"
timeout 150 python3 -m tpserve.cli bench model --device cuda --prefill 1024 --repeats 1 --decode-steps 32 \
  --batch 1 32 2>&1 | grep -E "^\||Error|error"
step "tiny checkpoints: each norm backend against fp32"
timeout 200 python3 bench/gpu_check_tiny.py --norms --configs default,variant 2>&1 | grep -E "^\||Error|error"
step "done"
