#!/usr/bin/env bash
# Fourteenth session, seventh call (~4 min, the last device minutes): the GPU proof rows on the final defaults
# (async scheduling, merged linears, Triton GEMV, conv_chunk, combine_sorted, mla-prefill auto):
# 1. the tiny checkpoints' greedy tokens with decode graphs vs eager, fp32 and bf16 (the second call ran out of
#    time after the first row while Triton compiled);
# 2. the demo model's bf16 greedy tokens, --gemv-backend torch vs triton (auto is triton now).
set -uo pipefail
source bench/gpu_env.sh
step "tiny checkpoints: decode graphs vs eager"
timeout 200 python3 bench/gpu_check_tiny.py --graphs 2>&1 | grep -E "^\||Error|error|Traceback" | head -16
step "demo model, bf16: gemv_backend torch vs triton"
timeout 60 python3 bench/backend_demo_tokens.py --switch gemv_backend 2>&1 | grep -E "^\||Error|error|Traceback" | head -4
step "done"
