#!/usr/bin/env bash
# Eighteenth session, second call (~8 min): the real config's widths cut to 8 layers (KKKM KKKM, dense MLP in the
# first 3), 4-bit experts (nvfp4, random weights made on the GPU) with what has landed since the seventh session
# measured it (qtile decode, Triton routing, graphs, sparse MLA prefill, the grouped SwiGLU kernel): prefill 32k
# and decode 1 / 8 / 32, the per-layer numbers issue 11 asks for, and a profile of 8 batch-1 decode steps (where
# the time goes with 4-bit experts).
set -uo pipefail
source bench/gpu_env.sh
step "real widths, 8 layers, nvfp4 experts"
timeout 420 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first --quantization nvfp4 \
  --prefill 32768 --repeats 1 --decode-steps 16 --batch 1 8 32 --profile 8 --json "$OUT/model_nvfp4_8layers.json" 2>&1 \
  | tee "$OUT/bench_model.log" | grep -E "^\||layers|captured|Error|error|Traceback|boot|weights"
save_triton_cache
step "done"
