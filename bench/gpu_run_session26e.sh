#!/usr/bin/env bash
# Twenty-sixth session, fifth call: why tests/kernels/test_pdl.py's PTX checks fail on this machine (they pass where
# Triton 3.6.0 assembles for sm_90 without a GPU), and where a batch-1 decode step's device time goes with --pdl on
# (real-width KKKMKKKM, NVFP4 experts, 8 profiled steps).
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "PTX test, first case"
python3 -c "import triton; print('triton', triton.__version__)"
timeout 200 python3 -m pytest -q -x --tb=short -p no:cacheprovider "tests/kernels/test_pdl.py::test_pdl_ptx_signals_then_waits_before_reading_inputs[rms_norm]" 2>&1 | grep -vE "^\s*$" | tail -25
step "profile: KKKMKKKM nvfp4 batch 1, --pdl on"
timeout 240 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first \
  --quantization nvfp4 --prefill 2048 --repeats 1 --decode-steps 16 --batch 1 --profile 8 \
  --json "$OUT/s26e_model_profile.json" 2>&1 | grep -E "decode step|device busy|^\| " | tail -24
save_triton_cache
step "done"
