#!/usr/bin/env bash
# Thirty-second session, first call: nvfp4_m1's gate|up with a token's pairs in one block (Config.pairs), its warps
# in lock step or not (Config.lockstep), and the experts' two kernels chained under PDL (experts' chain): the GPU
# test (bit for bit with the defaults), then bench/m1_configs.py's A/B at 1, 2 and 8 tokens, then block timelines
# at one token of the default and the lock-step form.
# It runs at commit 1ccebf3 (those forms and options were removed in the commit after it).
set -uo pipefail
source bench/gpu_env.sh
step "GPU test: test_nvfp4_m1"
timeout 150 python3 -m pytest -p no:cacheprovider -q tests/kernels/test_nvfp4_m1.py 2>&1 | tail -4
step "m1_configs: gate|up pairs a block, lock step, chained"
timeout 300 python3 bench/m1_configs.py --gate-up 1:2:2:8,1:2:2:8:ls,1:1:3:8,1:1:3:8:ls,1:2:2:4,1:2:2:4:ls,1:1:4:8:ls \
  --chain --tokens 1,2,8 --json "$OUT/s32_configs.json" 2>&1 | grep -E "MoE|  |Error|error" | tail -60
step "timelines at one token: default, then 1:2:2:8:ls"
timeout 60 python3 bench/m1_timeline.py --tokens 1 --json "$OUT/s32_tl_default.json" 2>&1 | head -8
timeout 60 python3 bench/m1_timeline.py --tokens 1 --gate-up 1:2:2:8:ls --json "$OUT/s32_tl_pg8ls.json" 2>&1 | head -8
step "done"
