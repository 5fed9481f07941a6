#!/usr/bin/env bash
# Twenty-third session, sixth call (~2 min): after kernels/mma_gemv.py's launch went through the tensor's device
# context and realigns views: the GPU tests (pytest, wheels from .whl_test as in ..23d.sh), the defaults against
# Triton again (quant_decode_sweep --sections mmadef) and the built-in model's FP8 tokens and speed
# (bench/quant_gemv_tokens.py).
set -uo pipefail
source bench/gpu_env.sh
step "GPU tests"
python3 -m pip install -q --no-index --no-deps --target /tmp/site-test .whl_test/*.whl
PYTHONPATH=/tmp/site-test:$PYTHONPATH timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/kernels/test_mma_gemv.py tests/test_config.py 2>&1 | tail -5
step "defaults against Triton"
timeout 200 python3 bench/quant_decode_sweep.py --sections mmadef --out "$OUT" 2>&1 | tee "$OUT/s23e_mmadef.log" \
  | grep -E "^\||Error|error"
step "built-in model, FP8: tokens and speed"
timeout 150 python3 bench/quant_gemv_tokens.py --batch 8 --max-tokens 64 --rounds 3 --json "$OUT/s23e_tokens.json" \
  2>&1 | grep -E "^(cuda|triton)|Error|error" | tail -8
step "done"
