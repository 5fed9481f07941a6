#!/usr/bin/env bash
# One device call (~5 min): the KDA commit and verify with their fla state index built once per step for every
# layer (and the commit writing the state after row counts-1 straight to the slot instead of masking g / beta),
# q / k / v made contiguous once for verify and commit.
# 1. tests/kernels/test_kda_fla.py on the GPU (verify / commit equal one-token decode steps bit for bit);
# 2. kernels per fused step (609 before) and per plain step (257);
# 3. bench spec batch 1 (greedy equality with plain; k=3 1.57-1.63x, adaptive 1.61-1.64x before);
# 4. adaptive vs fixed k=3 interleaved (0.972 before).
set -uo pipefail
source bench/gpu_env.sh
step "fla verify / commit tests on the GPU"
PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests timeout 120 python3 -m pytest -p no:cacheprovider -W ignore tests/kernels/test_kda_fla.py 2>&1 | grep -E "passed|failed|error"
step "kernels per phase, batch 1, k=3 fused"
timeout 80 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 30 \
  --json "$OUT/profile_commit.json" 2>&1 | grep -E "^\| (execute|draft|commit|execute_spec) |^##"
step "bench spec batch 1"
timeout 110 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 \
  --json "$OUT/spec_b1_commit.json" 2>&1 | grep -E "^\| 1 |Error|error|Traceback"
step "adaptive vs fixed k=3, interleaved"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 6 \
  2>&1 | grep -E "^median|^adaptive k|Error|error|Traceback"
step "done"
