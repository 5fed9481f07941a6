#!/usr/bin/env bash
# Twenty-fifth session, seventh call: nvfp4_m1's down kernel as a programmatic dependent launch of gate|up
# (kernels/pdl.py, new). GPU tests of kernels/nvfp4_m1.py (PDL bit for bit a plain launch, eager and in a graph);
# quant_decode_sweep --sections m1pdl (1 / 2 / 8 tokens, PDL against a plain launch, alternated twice).
set -uo pipefail
source bench/gpu_env.sh
step "GPU test"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_nvfp4_m1.py 2>&1 | tail -15
step "m1pdl"
timeout 200 python3 bench/quant_decode_sweep.py --sections m1pdl --out "$OUT" 2>&1 | tee "$OUT/s25g_m1pdl.log" | tail -12
step "done"
