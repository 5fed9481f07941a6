#!/usr/bin/env bash
# One device call on nvidia-h200 (~4 min): fused norms against the torch forms, each compared with the
# float32 run on the tiny checkpoints, and greedy tokens of the trained demo model in bf16.
set -uo pipefail
source bench/gpu_env.sh
step "demo model bf16: norm triton vs torch"
timeout 90 python3 bench/norm_demo_tokens.py 2>&1 | grep -E "^\||Error|error"
step "tiny checkpoints: each backend against fp32"
timeout 200 python3 bench/gpu_check_tiny.py --norms --configs default,variant 2>&1 | grep -E "^\||Error|error"
step "done"
