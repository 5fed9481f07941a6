#!/usr/bin/env bash
# Thirty-second session, third call: gate|up's later blocks asking L2 for down's weights as they end
# (nvfp4_m1 Config.tail): the GPU test with the form added, then bench/m1_tail.py at 1 and 2 tokens, twice.
# It runs at commit 3363924 (Config.tail and bench/m1_tail.py were removed in the commit after it).
set -uo pipefail
source bench/gpu_env.sh
step "GPU test: test_nvfp4_m1"
timeout 150 python3 -m pytest -p no:cacheprovider -q tests/kernels/test_nvfp4_m1.py -k gpu 2>&1 | tail -3
step "m1_tail"
timeout 200 python3 bench/m1_tail.py --tokens 1,2 --json "$OUT/s32c_tail.json" 2>&1 | grep -E "MoE|  |Error|error" | tail -12
timeout 200 python3 bench/m1_tail.py --tokens 1 --json "$OUT/s32c_tail2.json" 2>&1 | grep -E "MoE|  |Error|error" | tail -6
step "done"
