#!/usr/bin/env bash
# One device call (~3 min), the session's last: interleaved speedups (single `bench spec` runs moved by
# +-5-8% between processes this session: `bench/spec_ab.py` alternates two live engines).
# 1. tests/kernels/test_kda_fla.py on the GPU (the summary line the two earlier calls' greps missed);
# 2. fixed k=3 vs plain decoding, batch 1, 8 rounds (fused steps, argmax kernel: the defaults);
# 3. adaptive vs fixed k=3, 6 rounds (its k histogram now counts fused steps too).
set -uo pipefail
source bench/gpu_env.sh
step "fla verify / commit tests on the GPU"
PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests timeout 120 python3 -m pytest -rs -p no:cacheprovider \
  tests/kernels/test_kda_fla.py 2>&1 | tail -6
step "fixed k=3 vs off, interleaved"
timeout 150 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 8 --baseline off \
  --candidate fixed 2>&1 | grep -E "^\| [0-9]|^median|k per step|Error|error|Traceback"
step "adaptive vs fixed k=3, interleaved"
timeout 120 python3 bench/spec_ab.py --device cuda --batch 1 --k 3 --max-tokens 96 --rounds 6 \
  2>&1 | grep -E "^median|k per step|Error|error|Traceback"
step "done"
