#!/usr/bin/env bash
# Twenty-ninth session, fifth call: the fused kernel is issue-bound, not DRAM-bound (fourth call, Nsight Compute:
# the same 113 MB from DRAM as nvfp4_m1's two kernels, but ~11 warps an SM, stalls of ~7 cycles an instruction,
# branch-resolving 0.58 of them from wait_pending's switch; 16 warps x 3 stages 54 us against 12 x 6's 69):
# wait_pending without the switch, more warps an SM (16-32, two blocks of 12): GPU test, bench/m1_fused.py.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1_fused.py \
  -k "gpu" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert|^E " | tail -20
step "m1_fused"
timeout 300 python3 bench/m1_fused.py --rounds 2 --timeline --json "$OUT/s29e_fused.json" 2>&1 | grep -v "^fused Config" \
  | tail -30
step "done"
