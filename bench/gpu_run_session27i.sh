#!/usr/bin/env bash
# Twenty-seventh session, ninth call: the final tree -- the GPU tests of mma_gemv, PDL and nvfp4_m1 listed, and the
# engine with FP8 linears (KKKMKKKM, graphs, --pdl on, batch 1 / 2 / 8) once.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU tests"
timeout 240 python3 -m pytest -rA -p no:cacheprovider tests/kernels/test_mma_gemv.py tests/kernels/test_pdl.py \
  tests/kernels/test_nvfp4_m1.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -20
step "engine: KKKMKKKM fp8, --pdl on"
timeout 150 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first --quantization fp8 \
  --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 2 8 --pdl on --json "$OUT/s27i_model_fp8.json" 2>&1 \
  | grep -E "decode step|Error|error" | tail -4
step "done"
