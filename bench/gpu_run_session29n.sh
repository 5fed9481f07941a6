#!/usr/bin/env bash
# Twenty-ninth session, fourteenth call: h copied into a block by all its warps at once (each its share, then a
# count), longer sleeps in every wait (the thirteenth call: 28.3 M warp instructions against nvfp4_m1's 20.2 M, issue
# 55% busy: waiting warps spinning). The GPU test, bench/m1_fused.py with the timeline, Nsight Compute's count.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU test"
PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1_fused.py \
  -k "gpu" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert|^E " | tail -20
step "m1_fused"
timeout 300 python3 bench/m1_fused.py --configs 16:2:1,8:4:1,12:3:1 --rounds 2 --timeline --json "$OUT/s29n_fused.json" \
  2>&1 | grep -v "^fused Config" | tail -20
step "ncu"
timeout 200 ncu -k regex:'nvfp4_m1' --launch-skip 1 --launch-count 1 --metrics \
  sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum \
  python3 bench/m1_fused.py --configs 16:2:1 --ncu 2>&1 | grep -E "tpserve_|inst_executed|issue_active|duration" | tail -4
step "done"
