#!/usr/bin/env bash
# One device call on nvidia-h200 (< 600 s): what the fifth session of 2026-12-01 built and could not
# measure (its follow-up call was cut while Triton compiled on a fresh machine, so every step here
# has room for a cold compile):
#  1. `tpserve bench spec` at batch 1 and 64: the adaptive mode no longer drafts above the verify
#     graphs' largest batch; greedy draws computed inside the draft graphs; the KDA path printed;
#  2. the speculative greedy-token check in float32 and bfloat16 (gpu_check_spec.py);
#  3. the real config's widths cut to 8 layers (KKKM KKKM, dense MLP in the first 3 as the model has
#     it), 4-bit experts (nvfp4, random weights made on the GPU): prefill 32k and decode 1 / 8 / 32,
#     the per-layer numbers issue 11 asks for (divide by 8; the full model has 45 layers).
set -uo pipefail
source bench/gpu_env.sh
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step "bench spec (bf16, graphs)"
timeout 240 python3 -m tpserve.cli bench spec --device cuda --batch 1 64 --k 3 --max-tokens 96 \
  --json "$OUT/spec.json" --plot "$OUT/spec.png" 2>&1 | tee "$OUT/spec_bench.log" | grep -E "^\||KDA path|plot|Error|error"
step "speculative decoding: greedy tokens vs plain"
timeout 150 python3 bench/gpu_check_spec.py --device cuda 2>&1 | tee "$OUT/spec_check.log" | grep -E "^\||Error|error"
step "real widths, 8 layers, nvfp4 experts"
timeout 180 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first --quantization nvfp4 \
  --prefill 32768 --repeats 1 --decode-steps 16 --batch 1 8 32 --json "$OUT/model_nvfp4_8layers.json" 2>&1 \
  | tee "$OUT/bench_model.log" | grep -E "^\||layers|captured|Error|error"
step "done"
