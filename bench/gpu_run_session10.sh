#!/usr/bin/env bash
# One device call on nvidia-h200 for the tenth session (~9 min; step limits add up to 570 s): what the
# ninth session's kernels and host-time changes have not been measured on yet.
# 1. `bench spec` at batch 1 (issue 12's 1.8x goal) with every fused kernel on;
# 2. adaptive vs fixed k=3 interleaved (the policy now refits its cost models every 8 observations);
# 3. real-width decode with two MLA layers (KKKMKKKM: the indexer and MLA share grows) at batch 1, 32, 64;
# 4. the demo model's kernels per decode step (a regression check: 373 at the end of the ninth session).
set -uo pipefail
source bench/gpu_env.sh
step "bench spec, batch 1"
timeout 150 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 \
  --json "$OUT/spec.json" --plot "$OUT/spec.png" 2>&1 | grep -E "^\||Error|error"
step "adaptive vs fixed k=3, batch 1, interleaved"
timeout 130 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 6 2>&1 | tail -10
step "real-width KKKMKKKM decode"
timeout 150 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --prefill 1024 --repeats 1 \
  --decode-steps 32 --batch 1 32 64 --json "$OUT/model_kkkmkkkm.json" 2>&1 | grep -E "^\||Error|error"
step "demo model: kernels per decode step"
timeout 80 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 30 \
  --json "$OUT/profile.json" 2>&1 | grep -E "^\| (execute|draft|commit) |^##"
save_triton_cache
step "done"
