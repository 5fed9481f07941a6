#!/usr/bin/env bash
# Twentieth session, third call (~2 min): the CUDA ring all-reduce's compiled kernel on one GPU (W ranks as W
# workspaces on one H200, one stream each): bitwise the mesh kernels and the rank-order sum at W = 2, 3, 4, and at
# W = 4 with a poisoned opposite buffer that must stay untouched (bench/ring_one_gpu_check.py).
set -uo pipefail
source bench/gpu_env.sh
step "ring all-reduce on one GPU"
timeout 400 python3 bench/ring_one_gpu_check.py 2>&1 | tee "$OUT/ring_one_gpu.log" | grep -v -i warn | head -40
step "done"
