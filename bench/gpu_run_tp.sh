#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (< 600 s): the tensor-parallel issue's GPU checks.
#  1. tiny checkpoints, float32: CUDA TP=1 vs CPU, TP=2 over NCCL (with and without SP) vs TP=1;
#     meanwhile a throw-away TP=1 run on GPU 1 compiles fla-core's Triton kernels;
#  2. real-width KKKM layers (bf16, fla-core KDA with the corrected options), TP=1 then TP=2 (NCCL),
#     back to back on the same machine.
# Needs the wheels in .whl (bench/gpu_env.sh lists them). Logs and JSON go to $OUT.
set -uo pipefail
source bench/gpu_env.sh
CONFIGS=${CONFIGS:-default,shared,variant}
MODEL=(python3 -m tpserve.cli bench model --device cuda --prefill 4096 16384 --repeats 3 --decode-steps 16 --batch 1 32)
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c 'import torch, triton, fla; print("torch", torch.__version__, "triton", triton.__version__, "fla", fla.__version__)'
step "compile warm-up on GPU 1 (background, untimed)"
CUDA_VISIBLE_DEVICES=1 timeout 300 "${MODEL[@]}" --repeats 1 --decode-steps 2 > "$OUT/warmup.log" 2>&1 &
WARM=$!
step "tiny checkpoints ($CONFIGS): float32, TP=2 NCCL vs TP=1 vs CPU"
timeout 240 python3 bench/gpu_check_tiny.py --tp --configs "$CONFIGS" 2>&1 | tee "$OUT/tiny.log" | grep "^|"
wait $WARM; echo "warm-up exit code $?"; grep -E "^KDA|^\| prefill" "$OUT/warmup.log" | head -3
step "real-width KKKM, TP=1 (GPU 0)"
timeout 150 "${MODEL[@]}" --json "$OUT/model_tp1.json" 2>&1 | tee "$OUT/tp1.log" | grep -E "^\||^layers|^KDA"
step "real-width KKKM, TP=2, NCCL only"
timeout 150 "${MODEL[@]}" --tp 2 --no-custom-allreduce --json "$OUT/model_tp2.json" 2>&1 | tee "$OUT/tp2.log" \
  | grep -E "^\||^layers|^KDA"
step "done"
