#!/usr/bin/env bash
# Twenty-sixth session, fourth call: mma_gemv (the W8A16 / W4A16 GEMV at 2-8 rows) launched as a programmatic
# dependent (--pdl; kernels/launch_ex.py): its GPU test and test_pdl.py with their results listed; the chained
# timing against plain launches (quant_decode_sweep --sections mmapdl); the engine with FP8 linears, --pdl off / on
# alternated twice (real-width KKKMKKKM, CUDA graphs, batch 1 / 2 / 8).
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU tests"
timeout 300 python3 -m pytest -q -rA -p no:cacheprovider tests/kernels/test_pdl.py tests/kernels/test_mma_gemv.py \
  2>&1 | grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed" | tail -30
step "mmapdl"
timeout 300 python3 bench/quant_decode_sweep.py --sections mmapdl --out "$OUT" 2>&1 | tail -16
i=0
for mode in off on off on; do
  i=$((i + 1))
  step "engine: KKKMKKKM fp8, --pdl $mode ($i)"
  timeout 200 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first \
    --quantization fp8 --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 2 8 --pdl $mode \
    --json "$OUT/s26d_model_fp8_${i}_$mode.json" 2>&1 | grep -E "decode step|Error|error" | tail -4
done
save_triton_cache
step "done"
