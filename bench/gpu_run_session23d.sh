#!/usr/bin/env bash
# Twenty-third session, fifth call (~2 min): kernels/mma_gemv.py's defaults at 8 rows beside more warps a block and a
# deeper pipeline (quant_decode_sweep --sections mma3; that call also had an x_prefetch option, since removed), then
# the repo's GPU tests of the quantized GEMVs (pytest, from the wheels carried in .whl_test: pytest 9.2.0, pluggy
# 1.7.0, iniconfig 2.3.1, packaging 26.4, fetched with `pip download --no-deps --only-binary=:all:`).
set -uo pipefail
source bench/gpu_env.sh
step "mma3 sweep"
timeout 300 python3 bench/quant_decode_sweep.py --sections mma3 --out "$OUT" 2>&1 | tee "$OUT/s23d_mma3.log" \
  | grep -v "^  .*WRONG" | tail -60
grep -c WRONG "$OUT/s23d_mma3.log"
step "GPU tests"
python3 -m pip install -q --no-index --no-deps --target /tmp/site-test .whl_test/*.whl
PYTHONPATH=/tmp/site-test:$PYTHONPATH timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_mma_gemv.py tests/test_config.py 2>&1 | tail -5
step "done"
