#!/usr/bin/env bash
# One device call on nvidia-h200 (sixth session of 2026-12-01): speculative decoding with the greedy
# draft depths chained in one CUDA graph (chain_drafts, the default) against the same k drafted depth
# by depth, and plain decoding, at batch 1 with the shipped demo model (bf16, graphs). The first row
# pays the Triton compile on a fresh machine (~3 min).
set -uo pipefail
source bench/gpu_env.sh
step "bench spec, batch 1: off / k=3 / k=3 depths one by one / adaptive"
timeout 330 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --compare-chain --max-tokens 96 \
  --repeats 3 --json "$OUT/spec_chain.json" --plot "$OUT/spec_chain.png" 2>&1 | tee "$OUT/spec_chain.log" \
  | grep -E "^\||KDA path|plot|Error|error|captured"
step "done"
