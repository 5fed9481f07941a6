#!/usr/bin/env bash
# Eighteenth session, second call (~9 min). (1) W8A16 again around the first call's best at one row (16 x 512 K
# tiles, 78% of the floor), and the best three on 4096 x 12288 (the first call's script fed them wrongly);
# (2) the real config's widths cut to 8 layers (KKKM KKKM, dense MLP in the first 3), 4-bit experts (nvfp4, random
# weights made on the GPU) with what has landed since the seventh session measured it: prefill 32k and decode
# 1 / 8 / 32 (issue 11's per-layer numbers) and a profile of 8 batch-1 decode steps.
set -uo pipefail
source bench/gpu_env.sh
step "W8A16 GEMV sweep"
timeout 100 python3 bench/quant_decode_sweep.py --sections w8a16 --out "$OUT/w8" 2>&1 | tee "$OUT/w8.log" | head -40
step "real widths, 8 layers, nvfp4 experts"
timeout 420 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first --quantization nvfp4 \
  --prefill 32768 --repeats 1 --decode-steps 16 --batch 1 8 32 --profile 8 --json "$OUT/model_nvfp4_8layers.json" 2>&1 \
  | tee "$OUT/bench_model.log" | grep -E "^\||layers|captured|Error|error|Traceback|boot|weights" | head -60
step "done"
