#!/usr/bin/env bash
# Fourteenth session, fourth call (~6 min): prefill kernels (new): the KDA short conv of a prefill chunk in Triton
# (conv_chunk) and the grouped MoE's combine in one kernel (combine_sorted), checked against their torch forms at
# real widths and timed; the demo model's bf16 greedy tokens with --kda-prep-backend torch vs triton (its prefill
# takes conv_chunk now); real-width KKKM prefill 4k / 16k with every default and its 16k kernel profile.
set -uo pipefail
source bench/gpu_env.sh
step "prefill kernels against torch, real widths"
timeout 120 python3 bench/prefill_kernels.py --json "$OUT/prefill_kernels.json" 2>&1 | grep -E "^\||Error|error|Traceback" | head -8
step "demo model, bf16: kda_prep_backend torch vs triton"
timeout 60 python3 bench/backend_demo_tokens.py --switch kda_prep_backend 2>&1 | grep -E "^\||Error|error|Traceback" | head -4
step "real-width KKKM prefill, defaults, profile 16k"
timeout 120 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 5 \
  --batch 1 --decode-steps 16 --profile-prefill 16384 --json "$OUT/model_kkkm_prefill.json" 2>&1 \
  | grep -E "^\| |^device busy|Error|error|Traceback" | head -34
save_triton_cache
step "done"
