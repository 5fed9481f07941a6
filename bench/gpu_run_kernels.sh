#!/usr/bin/env bash
# One device call on nvidia-h200-x2 (< 600 s): the fused mHC and grouped MoE Triton kernels.
#  1. kernels vs their torch forms on GPU 0 (correctness, time per call), while a throw-away run on
#     GPU 1 compiles fla-core's and our Triton kernels;
#  2. tiny checkpoint, float32 (auto now picks the Triton mHC / MoE on CUDA): greedy vs CPU, TP=2 vs TP=1;
#  3. real-width KKKM: TP=1 with the torch mHC / MoE (as run 6), TP=1 with the Triton ones, TP=2 (NCCL);
#  accuracy (not in the default STEPS): both MoE forms against fp32 math up to 8192 tokens, and bf16
#     greedy agreement of the Triton mHC + MoE with the torch forms on the tiny checkpoints.
#  profile (not in the default STEPS): TP=1 with the default switches and a host-side profile of
#     decode (batch 1 and 32), then TP=2 with the default switches (custom collectives on).
#  ab (not in the default STEPS): TP=2 with the custom collectives off then on, in one call.
# Usage: [STEPS="kernels tiny model accuracy profile ab"] bash bench/gpu_run_kernels.sh
# Needs the wheels in .whl (bench/gpu_env.sh lists them). Logs and JSON go to $OUT.
set -uo pipefail
source bench/gpu_env.sh
STEPS=${STEPS:-kernels tiny model}
want() { [[ " $STEPS " == *" $1 "* ]]; }
MODEL=(python3 -m tpserve.cli bench model --device cuda --prefill 4096 16384 --repeats 3 --decode-steps 16 --batch 1 32)
TORCH_KERNELS=(--mhc-backend torch --moe-backend torch)
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if want accuracy; then
step "MoE forms vs fp32 math, up to 8192 tokens (GPU 0)"
CUDA_VISIBLE_DEVICES=0 timeout 200 python3 bench/gpu_check_kernels.py --skip-mhc --inter 2048 --reference \
  --tokens 1,32,256,512,1024,2048,4096,8192 2>&1 | tee "$OUT/kernels_accuracy.log" | grep -E "^\||Error"
step "tiny checkpoints, bf16: Triton mHC + MoE vs torch forms"
timeout 150 python3 bench/gpu_check_tiny.py --kernels-only 2>&1 | tee "$OUT/tiny_kernels.log" | grep -E "^\||Error"
fi
if want profile; then
PROF=(python3 -m tpserve.cli bench model --device cuda --decode-steps 16)
step "real-width KKKM, TP=1, default switches, host profile of decode at batch 1"
timeout 220 "${PROF[@]}" --prefill 2048 4096 16384 --repeats 3 --batch 1 32 --profile 5 --json "$OUT/model_tp1_prof1.json" \
  2>&1 | tee "$OUT/tp1_prof1.log" | grep -E "^\||^layers|^profile"
step "same, host profile at batch 32"
timeout 100 "${PROF[@]}" --prefill 2048 --repeats 1 --batch 32 --profile 5 --json "$OUT/model_tp1_prof32.json" \
  2>&1 | tee "$OUT/tp1_prof32.log" | grep -E "^\||^profile"
step "real-width KKKM, TP=2, default switches (custom collectives on)"
timeout 180 "${PROF[@]}" --tp 2 --prefill 2048 4096 16384 --repeats 3 --batch 1 32 --json "$OUT/model_tp2_ar.json" \
  2>&1 | tee "$OUT/tp2_ar.log" | grep -E "^\||^layers"
fi
if want ab; then
AB=(python3 -m tpserve.cli bench model --device cuda --tp 2 --kda-backend torch --prefill 2048 --repeats 3 \
    --decode-steps 16 --batch 1 32)
step "TP=2 A/B in one call: custom collectives off, then on (KDA on the torch path: nothing to compile)"
timeout 90 "${AB[@]}" --no-custom-allreduce --json "$OUT/ab_off.json" 2>&1 | tee "$OUT/ab_off.log" | grep -E "^\||^layers"
timeout 90 "${AB[@]}" --custom-allreduce --json "$OUT/ab_on.json" 2>&1 | tee "$OUT/ab_on.log" | grep -E "^\||^layers"
fi
want model || want kernels || want tiny || { step "done"; exit 0; }
step "compile warm-up on GPU 1 (background, untimed)"
(CUDA_VISIBLE_DEVICES=1 timeout 200 "${MODEL[@]}" --repeats 1 --decode-steps 2 > "$OUT/warmup.log" 2>&1;
 CUDA_VISIBLE_DEVICES=1 timeout 100 "${MODEL[@]}" "${TORCH_KERNELS[@]}" --repeats 1 --decode-steps 2 \
   >> "$OUT/warmup.log" 2>&1) &
WARM=$!
if want kernels; then
step "kernels vs torch forms (GPU 0)"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 bench/gpu_check_kernels.py 2>&1 | tee "$OUT/kernels.log" | grep -E "^\||Error"
fi
if want tiny; then
step "tiny default config, float32, Triton mHC/MoE: TP=1 / TP=2 vs CPU"
timeout 150 python3 bench/gpu_check_tiny.py --tp --configs default 2>&1 | tee "$OUT/tiny.log" | grep "^|" | tail -4
fi
wait $WARM; echo "warm-up exit code $?"
want model || { step "done"; exit 0; }
step "real-width KKKM, TP=1, torch mHC/MoE"
timeout 100 "${MODEL[@]}" "${TORCH_KERNELS[@]}" --json "$OUT/model_tp1_torch.json" 2>&1 | tee "$OUT/tp1_torch.log" | grep -E "^\||^layers"
step "real-width KKKM, TP=1, Triton mHC/MoE"
timeout 100 "${MODEL[@]}" --json "$OUT/model_tp1.json" 2>&1 | tee "$OUT/tp1.log" | grep -E "^\||^layers"
step "real-width KKKM, TP=2 (NCCL), Triton mHC/MoE"
timeout 150 "${MODEL[@]}" --tp 2 --no-custom-allreduce --json "$OUT/model_tp2.json" 2>&1 | tee "$OUT/tp2.log" \
  | grep -E "^\||^layers"
step "done"
