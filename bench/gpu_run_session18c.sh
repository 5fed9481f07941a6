#!/usr/bin/env bash
# Eighteenth session, third call (~5 min), after the defaults changed: the FP8 GEMV at one row now 16 x 512 tiles
# on 8 warps, K split below 2 waves (kernels/quant_gemv.w8a16_gemv), the grouped experts five pipeline stages at
# one token. (1) W8A16 both shapes, M = 1 and 8, with the default config timed beside the sweep ("default"; M = 8
# adds the per-value path and split-K qtile); (2) 8 real-width layers, NVFP4 experts and FP8 (all linears) again:
# prefill 32k, decode 1 / 8 / 32; (3) the grouped experts' decode with 8 warps per program (at one token a 64 x 256
# program on 4 warps is alone on its SM: one warp per scheduler); (4) real-width KKKM bf16 prefill 4k / 16k.
set -uo pipefail
source bench/gpu_env.sh
step "W8A16 GEMV sweep, the defaults beside it"
timeout 120 python3 bench/quant_decode_sweep.py --sections w8a16 --out "$OUT/w8" 2>&1 | tee "$OUT/w8.log" | head -60
for q in nvfp4 fp8; do
  step "real widths, 8 layers, $q"
  timeout 170 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first --quantization $q \
    --prefill 32768 --repeats 1 --decode-steps 16 --batch 1 8 32 --json "$OUT/model_${q}_8layers.json" 2>&1 \
    | tee "$OUT/bench_model_$q.log" | grep -E "^\| (prefill|decode)|memory plan|Error|error|Traceback" | head -20
done
step "MoE decode, more warps"
timeout 150 python3 bench/quant_decode_sweep.py --sections moe --out "$OUT/moe" 2>&1 | tee "$OUT/moe.log" \
  | grep -v "^\s*$" | grep -v -i warn | head -50
step "real-width KKKM bf16 prefill 4k / 16k (issue 10: 4k per token against 16k, with the grouped SwiGLU kernel)"
timeout 130 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 3 \
  --batch 1 --decode-steps 8 --json "$OUT/model_kkkm_prefill.json" 2>&1 | grep -E "^\| (prefill|decode)|Error|Traceback"
step "done"
