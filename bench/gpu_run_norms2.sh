#!/usr/bin/env bash
# One device call on nvidia-h200 (~5 min with a carried Triton cache): the rest of the fused-norm
# checks (bench/gpu_run_norms.sh's tiny-checkpoint step was cut by its limit after one row) and
# `bench spec` at batch 1 again with each norm backend, in the order triton, torch, triton, torch.
# (In the 2026-12-02 run recorded in BENCHMARKS.md, `bench spec` still dropped --norm-backend, so its
# passes all ran the fused norms; fixed since.)
set -uo pipefail
source bench/gpu_env.sh
step "tiny checkpoints: norm triton vs torch"
timeout 240 python3 bench/gpu_check_tiny.py --norms --configs default,variant 2>&1 | grep -E "^\||Error|error"
for nb in triton torch triton torch; do
  step "bench spec, batch 1, k=3, norm-backend $nb"
  timeout 60 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 --norm-backend $nb \
    2>&1 | grep -E "^\| 1 |Error|error"
done
step "done"
