#!/usr/bin/env bash
# Thirtieth session, first call: (1) nvfp4_m1's GPU tests (new: down with Config.l2_ahead 1 and 2 bit for bit the
# default); (2) section m1ahead: the experts at 1, 2, 8 tokens, down's blocks first asking L2 for all of their W
# (bulk prefetches while gate|up's last blocks run) against the default; (3) the one-token timeline with and
# without it; (4) bench/disk_read.py (new): this machine's disk read through the page cache and around it
# (O_DIRECT), threads and chunk sizes (issue 11's restore >= 3 GB/s).
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU tests"
PYTHONPATH=/tmp/site:$PYTHONPATH timeout 200 python3 -m pytest -p no:cacheprovider tests/kernels/test_nvfp4_m1.py \
  -k "gpu" 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed|Error|assert|^E " | tail -20
step "m1ahead"
timeout 250 python3 bench/quant_decode_sweep.py --sections m1ahead --out "$OUT/s30_m1ahead" 2>&1 \
  | grep -E "MoE|  |Error|error" | tail -20
for a in 0 1 2; do
  step "timeline, 1 token, down l2_ahead $a"
  timeout 100 python3 bench/m1_timeline.py --tokens 1 --down-ahead $a --json "$OUT/s30_timeline_a$a.json" 2>&1 \
    | grep -E "token|\| 0 |Error|error" | head -8
done
step "disk"
df -hT . /tmp | cat
timeout 200 python3 bench/disk_read.py --gib 8 2>&1 | grep -v "writing:"
step "done"
