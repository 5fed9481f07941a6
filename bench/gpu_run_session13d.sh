#!/usr/bin/env bash
# Thirteenth session, fourth call (~5 min): the Triton decode GEMV (kernels/gemv_triton.py, --gemv-backend)
# 1. against cuBLAS on every dense-linear shape of the real-width KKKM model at M 1/4/8/16: error vs a float64
#    product, time from graph replays over weight copies larger than L2, floor;
# 2. real-width KKKM decode at batch 1 / 32 / 64 with --gemv-backend torch, triton, torch again (A/B/A).
set -uo pipefail
source bench/gpu_env.sh
step "decode GEMV: Triton vs cuBLAS on the real-width KKKM dense linears"
timeout 240 python3 bench/gemv_kernels.py --layers KKKM --json "$OUT/gemv_kernels.json" 2>&1 | grep -E "^\||per decode|Error|error" | head -50
i=0
for b in torch triton torch; do
  i=$((i + 1))
  step "real-width KKKM decode, --gemv-backend $b (run $i)"
  timeout 120 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
    --decode-steps 32 --batch 1 32 64 --gemv-backend $b --json "$OUT/model_kkkm_gemv_${i}_$b.json" 2>&1 \
    | grep -E "^\| (decode|prefill)|Error|error" | head -8
done
save_triton_cache
step "done"
