#!/usr/bin/env bash
# One device call on nvidia-h200 (~3 min): batch 64, plain vs adaptive speculation (issue 12: no slowdown
# at batch 64), after the adaptive mode stopped running the MTP layer at batches above the verify graphs.
set -uo pipefail
source bench/gpu_env.sh
for run in 1 2; do
  step "bench spec, batch 64, off vs adaptive (run $run)"
  timeout 110 python3 -m tpserve.cli bench spec --device cuda --batch 64 --k 3 --no-fixed --max-tokens 96 \
    --repeats 3 --json "$OUT/spec_b64_$run.json" 2>&1 | grep -E "^\| 64 |Error|error"
done
step "done"
