#!/usr/bin/env bash
# Twenty-sixth session, second call: --pdl (programmatic dependent launch between our Triton kernels of a step).
# The GPU tests (each kernel bit for bit with and without PDL, eager and in a graph; greedy tokens on and off), the
# GEMV chain again (the 8-row form now waits first), then the engine: real-width KKKMKKKM, NVFP4 experts, CUDA
# graphs, decode batch 1 / 2 / 8, --pdl off and on alternated twice in one call.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_pdl.py tests/kernels/test_gemv_triton.py \
  tests/kernels/test_norm_triton.py tests/kernels/test_act_triton.py tests/kernels/test_mhc.py 2>&1 | tail -6
step "pdl_chain M=8"
timeout 200 python3 bench/pdl_chain.py --rows 8 --repeats 8 --rounds 3 --json "$OUT/s26b_pdl_chain_m8.json" 2>&1 | tail -7
i=0
for mode in off on off on; do
  i=$((i + 1))
  step "engine: KKKMKKKM nvfp4, --pdl $mode ($i)"
  timeout 240 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first \
    --quantization nvfp4 --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 2 8 --pdl $mode \
    --json "$OUT/s26b_model_${i}_$mode.json" 2>&1 | grep -E "decode step|pdl=|Error|error" | tail -5
done
save_triton_cache
step "done"
