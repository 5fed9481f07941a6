#!/usr/bin/env bash
# Twenty-third session, fourth call (~5 min): the CUDA decode GEMV as the default. (1) w8a16_gemv / w4a16_gemv's
# defaults against the Triton kernels, 1-8 rows (quant_decode_sweep --sections mmadef); (2) the built-in model
# quantized to FP8: greedy tokens of --quant-gemv-backend cuda and triton against the CPU's float32, and decode
# tok/s at batch 8 (bench/quant_gemv_tokens.py); (3) real-width KKKM with every linear FP8 (random weights),
# decode batch 1 / 8 under each backend (bench model).
set -uo pipefail
source bench/gpu_env.sh
step "defaults against Triton"
timeout 200 python3 bench/quant_decode_sweep.py --sections mmadef --out "$OUT" 2>&1 | tee "$OUT/s23c_mmadef.log" \
  | grep -E "^\||Error|error"
step "built-in model, FP8: tokens and speed"
timeout 150 python3 bench/quant_gemv_tokens.py --batch 8 --max-tokens 64 --rounds 3 --json "$OUT/s23c_tokens.json" \
  2>&1 | grep -vE "Warning|warn|^\s*$" | tail -8
for b in triton cuda; do
  step "real-width KKKM, every linear FP8, --quant-gemv-backend $b"
  timeout 170 python3 -m tpserve.cli bench model --device cuda --layers KKKM --quantization fp8 --load-format dummy \
    --prefill 256 --repeats 1 --decode-steps 32 --batch 1 8 --quant-gemv-backend $b \
    --json "$OUT/s23c_kkkm_fp8_$b.json" 2>&1 | grep -E "decode|prefill|Error|error" | tail -6
done
step "done"
