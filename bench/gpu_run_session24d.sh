#!/usr/bin/env bash
# Twenty-fourth session, fourth call: the defaults chosen from the third call (nvfp4_m1 with the "shift" decode,
# two stages; the engine's NVFP4 experts at up to 8 tokens and the one-row NVFP4 GEMV through it under
# --quant-gemv-backend cuda). GPU tests; quant_decode_sweep --sections m1def (defaults beside mma_gemv / Triton,
# experts at 1-32 tokens); then the engine, real-width KKKMKKKM with NVFP4 experts (random weights made on the GPU),
# decode at batch 1 / 8 / 32 under --quant-gemv-backend triton and cuda in one call.
set -uo pipefail
source bench/gpu_env.sh
step "GPU tests"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_nvfp4_m1.py tests/kernels/test_mma_gemv.py \
  tests/kernels/test_quant_triton.py 2>&1 | tail -6
step "m1def"
timeout 200 python3 bench/quant_decode_sweep.py --sections m1def --out "$OUT" 2>&1 | tee "$OUT/s24d_m1def.log" | tail -30
for backend in triton cuda; do
  step "engine: KKKMKKKM nvfp4, --quant-gemv-backend $backend"
  timeout 240 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first --quantization nvfp4 \
    --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 8 32 --quant-gemv-backend $backend \
    --json "$OUT/s24d_model_$backend.json" 2>&1 | tail -14
done
save_triton_cache
step "done"
