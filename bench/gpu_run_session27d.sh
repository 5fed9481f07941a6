#!/usr/bin/env bash
# Twenty-seventh session, fourth call: can the bulk ring take W fast at all? `quant_decode_sweep.py --sections
# mmabulkcopy` (the bulk kernel compiled with COPY_ONLY: W's copies and the slot handshakes, no x, no sums; beside
# torch's sum of the same bytes and the register-load default), then the GPU tests of mma_gemv.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>&1 | tail -2
step "mmabulkcopy"
timeout 300 python3 bench/quant_decode_sweep.py --sections mmabulkcopy --out "$OUT/s27d" 2>&1 | tail -30
step "GPU tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mma_gemv.py 2>&1 | tail -8
step "done"
