#!/usr/bin/env bash
# Fifteenth session, seventh call (~5 min): the mHC stream norm + projection of prefill steps in one kernel
# (kernels/hc_project_triton.py, new, --mhc-project-backend): against the path it replaces and float64 at real
# widths; real-width KKKM prefill 4k / 16k with --mhc-project-backend triton (the new default) and torch, one
# process each; the demo model's bf16 greedy tokens torch vs triton if time is left.
set -uo pipefail
source bench/gpu_env.sh
step "prefill kernels at real widths"
timeout 60 python3 bench/prefill_kernels.py --json "$OUT/prefill_kernels.json" 2>&1 | grep -E "^\||^hc_project|Error|error|Traceback" | head -12
for m in triton torch; do
  step "real-width KKKM prefill 4k / 16k, --mhc-project-backend $m"
  timeout 75 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 5 \
    --batch 1 --decode-steps 8 --mhc-project-backend $m --json "$OUT/model_prefill_project_$m.json" 2>&1 \
    | grep -E "^\| (prefill|decode)|Error|error|Traceback" | head -4
done
step "demo model, bf16: mhc_project_backend torch vs triton"
timeout 100 python3 bench/backend_demo_tokens.py --switch mhc_project_backend 2>&1 | grep -E "^\||Error|error|Traceback" | head -4
step "done"
