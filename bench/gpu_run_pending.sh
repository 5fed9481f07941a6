#!/usr/bin/env bash
# One device call on nvidia-h200 (< 600 s): what is built and not yet measured on a GPU.
# The real config's widths cut to 8 layers (KKKM KKKM, dense MLP in the first 3 as the model has it),
# 4-bit experts (nvfp4, random weights made on the GPU): prefill 32k and decode 1 / 8 / 32, the
# per-layer numbers issue 11 asks for (divide by 8; the full model has 45 layers). In the sixth
# session of 2026-12-01 this step was killed by a 180 s limit before it printed anything (on a machine
# that had compiled the demo model's kernels, not these), so it gets the whole call here.
set -uo pipefail
source bench/gpu_env.sh
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step "real widths, 8 layers, nvfp4 experts"
timeout 540 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first --quantization nvfp4 \
  --prefill 32768 --repeats 1 --decode-steps 16 --batch 1 8 32 --json "$OUT/model_nvfp4_8layers.json" 2>&1 \
  | tee "$OUT/bench_model.log" | grep -E "^\||layers|captured|Error|error|it/s"
save_triton_cache
step "done"
