#!/usr/bin/env bash
# Twenty-seventh session, third call: mma_gemv's stage "bulk" with x staged in each ring slot beside W (the second
# call's Nsight Compute found the first form's consumers waiting on x's global loads, L1 left small by the ring):
# its GPU tests, then `quant_decode_sweep.py --sections mmabulk`.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>&1 | tail -2
export PYTHONPATH=$PYTHONPATH:$PWD/tests
step "GPU tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mma_gemv.py 2>&1 | tail -8
step "mmabulk"
timeout 330 python3 bench/quant_decode_sweep.py --sections mmabulk --out "$OUT/s27c" 2>&1 | tail -100
step "done"
