#!/usr/bin/env bash
# Twenty-fourth session, fifth call: the engine A/B the fourth call could not finish (its triton run spent its 240 s
# compiling; the Triton cache it saved is carried here): real-width KKKMKKKM with NVFP4 experts, decode batch 1 / 8
# / 32 under --quant-gemv-backend triton and cuda (M1_MAX_TOKENS now 32, from the fourth call's 16 / 32-token
# rows); then greedy tokens under both (bench/nvfp4_m1_tokens.py), and the GPU tests the fourth call failed on.
set -uo pipefail
source bench/gpu_env.sh
for backend in triton cuda; do
  step "engine: KKKMKKKM nvfp4, --quant-gemv-backend $backend"
  timeout 200 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first --quantization nvfp4 \
    --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 8 32 --quant-gemv-backend $backend \
    --json "$OUT/s24e_model_$backend.json" 2>&1 | tail -7
done
step "tokens"
timeout 150 python3 bench/nvfp4_m1_tokens.py --json "$OUT/s24e_tokens.json" 2>&1 | tail -3
step "GPU tests"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_nvfp4_m1.py \
  tests/kernels/test_quant_triton.py -k "engine or grouped_quantized" 2>&1 | tail -4
save_triton_cache
step "done"
