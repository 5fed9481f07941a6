#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (<= 600 s): fla kernel self-test, CUDA correctness of the tiny
# model (fp32, TP=1 and TP=2 with the custom all-reduce), real-width timings TP=1 / TP=2 with the
# custom collectives on and off, and the graph-captured collectives table. Logs go to $OUT.
set -uo pipefail
source bench/gpu_env.sh
export TPSERVE_LOG_LEVEL=INFO
MODEL=(python3 -m tpserve.cli bench model --device cuda --prefill 4096 16384 --repeats 2 --decode-steps 16 --batch 1 32)
step "fla-core KDA kernels vs torch reference"
timeout 80 python3 bench/gpu_check_fla.py 2>&1 | grep "^|"
step "tiny default config: CUDA fp32 (fla), TP=2 NCCL+SP+custom all-reduce, vs CPU"
timeout 110 python3 bench/gpu_check_tiny.py --tp --custom-allreduce --configs default 2>&1 | tee "$OUT/tiny.log" | grep -E "^\||self-test"
step "real-width KKKM TP=1"
timeout 100 "${MODEL[@]}" --json "$OUT/model_tp1.json" 2>&1 | grep -E "^\||^layers|^KDA"
step "real-width KKKM TP=2, custom collectives on"
timeout 110 "${MODEL[@]}" --tp 2 --json "$OUT/model_tp2_ar.json" 2>&1 | grep -E "^\||^layers|^KDA"
step "collectives, CUDA graph replays, bf16"
timeout 90 python3 -m tpserve.tools.collectives bench --world 2 --device cuda --graph --dtypes bfloat16 \
  --ops all_reduce --sizes 8K,32K,256K,1M,8M,32M,128M,256M --json "$OUT/graph.json" --plot "$OUT/graph.png" \
  --timeout 85 2>&1 | tail -16
step "real-width KKKM TP=2, custom collectives off"
timeout 100 "${MODEL[@]}" --tp 2 --no-custom-allreduce --json "$OUT/model_tp2_nccl.json" 2>&1 | grep -E "^\||^layers|^KDA"
step "done"
