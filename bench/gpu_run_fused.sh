#!/usr/bin/env bash
# One device call (~6 min): fused speculative steps (`--draft-graph fused`: acceptance, KDA commit and the next
# drafts in one more graph after the verify graph, one host copy per step) against the chain (the default).
# 1. bench spec batch 1, k=3 and adaptive, fused then chain (greedy equality with plain in each row);
# 2. phases per step, fused (bench/spec_breakdown.py);
# 3. adaptive vs fixed k=3 interleaved, fused (bench/spec_ab.py; 0.976 with chain in the tenth session);
# 4. batch 64: adaptive vs plain interleaved (0.73x in bench spec this session, 1.3x in spec_breakdown: order).
set -uo pipefail
source bench/gpu_env.sh
for g in fused chain; do
  step "bench spec batch 1, --draft-graph $g"
  timeout 110 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 --draft-graph $g \
    --json "$OUT/spec_b1_$g.json" 2>&1 | grep -E "^\| 1 |Error|error|Traceback"
done
step "phases, batch 1, k=3 fused"
timeout 100 python3 bench/spec_breakdown.py --device cuda --dtype bfloat16 --batch 1 --k 3 --max-tokens 96 \
  --draft-graph fused 2>&1 | grep -E "^\| (off|k=)|Error|error|Traceback"
step "adaptive vs fixed k=3, fused, interleaved"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 6 --draft-graph fused \
  2>&1 | grep -E "^median|^adaptive k|Error|error|Traceback"
step "batch 64: adaptive vs off, interleaved"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 64 --k 3 --max-tokens 96 --rounds 6 --baseline off \
  2>&1 | grep -E "^\||^median|^adaptive k|Error|error|Traceback"
save_triton_cache
step "done"
