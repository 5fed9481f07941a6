#!/usr/bin/env bash
# A second call for the next session (~3 min), prepared in the twelfth: where a real-width KKKM decode step at
# batch 1 spends its 1.827 ms (issue 10's goal 1.6 ms; floor 0.978 ms): the kernel table of 8 profiled steps.
set -uo pipefail
source bench/gpu_env.sh
step "real-width KKKM decode batch 1, profiled"
timeout 200 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
  --decode-steps 32 --batch 1 --profile 8 --json "$OUT/model_kkkm_profile.json" 2>&1 | grep -E "^\||Error|error" | head -60
save_triton_cache
step "done"
