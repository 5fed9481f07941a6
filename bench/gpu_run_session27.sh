#!/usr/bin/env bash
# Twenty-seventh session, first call: mma_gemv's W through bulk copies (Config.stage "bulk", kernels/mma_gemv_bulk.py)
# -- its GPU tests (bit for bit the interleaved register loads, PDL chains in a graph), then
# `quant_decode_sweep.py --sections mmabulk` (both formats, both shapes, 1-8 rows, against the defaults; the best
# at 8 rows plain against PDL). It ran the bulk kernel's first form, which read x from global memory as the register
# loads do (committed only in its second form, with x staged in the ring: see gpu_run_session27c.sh); its GPU test
# then failed on a config past the shared-memory limit, since changed.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>&1 | tail -2
step "GPU tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mma_gemv.py 2>&1 | tail -8
step "mmabulk"
timeout 330 python3 bench/quant_decode_sweep.py --sections mmabulk --out "$OUT/s27" 2>&1 | tail -90
save_triton_cache
step "done"
