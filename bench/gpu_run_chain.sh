#!/usr/bin/env bash
# One device call on nvidia-h200 (~6 min): the draft chain (`--draft-graph chain`: the MTP catch-up and
# every chained depth in one graph replay) against one replay per depth (`depth`), batch 1, k = 3, on
# the built-in demo model; then where a k=3 step's time goes with the chain, adaptive vs fixed k, and
# batch 64 (issue 12's "no slowdown").
set -uo pipefail
source bench/gpu_env.sh
for mode in chain depth chain depth; do
  step "bench spec, batch 1, draft graph $mode"
  TPSERVE_DRAFT_GRAPH=$mode timeout 110 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 \
    --max-tokens 96 --json "$OUT/spec_$mode.json" 2>&1 | grep -E "^\| 1 |Error|error"
done
step "demo model: kernels and time per phase, k=3, draft chain"
timeout 80 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 12 \
  --json "$OUT/profile_chain.json" 2>&1 | grep -E "^\| (execute|draft|commit) |^##"
step "adaptive vs fixed k=3, batch 1, interleaved (draft chain)"
timeout 110 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 6 2>&1 | tail -4
step "bench spec, batch 64"
timeout 150 python3 -m tpserve.cli bench spec --device cuda --batch 64 --k 3 --max-tokens 96 --repeats 1 \
  --json "$OUT/spec_b64.json" 2>&1 | grep -E "^\||Error|error"
save_triton_cache
step "done"
