#!/usr/bin/env bash
# One device call (~6 min): fused speculative steps as the default (`--draft-graph fused`), sequences with
# truncated drafts padded into them.
# 1. bench spec batch 1 (off, k=3, adaptive; greedy equality with plain);
# 2. kernels per phase, fused (bench/decode_profile.py: execute_spec = verify + commit + drafts);
# 3. adaptive vs fixed k=3 interleaved (0.925 before truncated sequences were padded into fused steps);
# 4. batch 64: adaptive vs plain interleaved, 10 rounds (median 0.977 over 6, rounds 0.94-1.30).
set -uo pipefail
source bench/gpu_env.sh
step "bench spec batch 1 (fused, the default)"
timeout 110 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 \
  --json "$OUT/spec_b1_fused.json" 2>&1 | grep -E "^\| 1 |Error|error|Traceback"
step "kernels per phase, batch 1, k=3 fused"
timeout 80 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 12 \
  --json "$OUT/profile_fused.json" 2>&1 | grep -E "^\| (execute|draft|commit|execute_spec) |^##"
step "adaptive vs fixed k=3, interleaved"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 6 \
  2>&1 | grep -E "^median|^adaptive k|Error|error|Traceback"
step "batch 64: adaptive vs off, interleaved"
timeout 200 python3 bench/spec_ab.py --device cuda --batch 64 --k 3 --max-tokens 96 --rounds 10 --baseline off \
  2>&1 | grep -E "^\| [0-9]|^median|^adaptive k|Error|error|Traceback"
step "done"
