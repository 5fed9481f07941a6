#!/usr/bin/env bash
# Twenty-seventh session, fifth call: why FP8 mma_gemv slows under PDL (s26 mmapdl) -- a guess: its blocks leave room
# on the SMs (FP8 4096 x 12288: 256 blocks, 3 fit an SM), so the dependent grid's blocks start early and unevenly.
# `quant_decode_sweep.py --sections mmacap`: the defaults with Config.max_blocks 2 / 3 / 4 against none, plain and
# PDL; then the GPU tests of mma_gemv.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>&1 | tail -2
step "mmacap"
timeout 300 python3 bench/quant_decode_sweep.py --sections mmacap --out "$OUT/s27e" 2>&1 | tail -60
step "GPU tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mma_gemv.py 2>&1 | tail -8
step "done"
