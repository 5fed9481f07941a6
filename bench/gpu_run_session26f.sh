#!/usr/bin/env bash
# Twenty-sixth session, sixth call: gemv_triton.gemv_split (one-row linears of fewer than 2048 outputs split over
# K: the KDA f_a | g_a | b projections, the router, the mHC projection; --gemv-split) under --pdl. GPU tests
# (test_pdl.py: kernels bit for bit with and without PDL, PTX order, greedy tokens with --pdl and --gemv-split on
# and off), CUDA against CPU tokens on the tiny checkpoints with graphs, then the engine: real-width KKKMKKKM with
# NVFP4 experts, --no-gemv-split / --gemv-split alternated twice, batch 1 / 2 / 8.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU tests"
timeout 300 python3 -m pytest -q -rA -p no:cacheprovider tests/kernels/test_pdl.py 2>&1 \
  | grep -E "^(FAILED|ERROR)|passed|failed" | tail -12
step "tiny checkpoints: CUDA graphs against the CPU"
timeout 300 python3 bench/gpu_check_tiny.py --graphs 2>&1 | tail -8
i=0
for mode in no-gemv-split gemv-split no-gemv-split gemv-split; do
  i=$((i + 1))
  step "engine: KKKMKKKM nvfp4, --$mode ($i)"
  timeout 200 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first \
    --quantization nvfp4 --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 2 8 --$mode \
    --json "$OUT/s26f_model_${i}_$mode.json" 2>&1 | grep -E "decode step|Error|error" | tail -4
done
save_triton_cache
step "done"
