#!/usr/bin/env bash
# Twenty-seventh session, eighth call: the one-wave cap for nvfp4_m1's down kernel under PDL (down_sum at one token:
# 256 blocks, 3 fit an SM, capped to 2): the GPU tests (test_nvfp4_m1, test_mma_gemv), `quant_decode_sweep.py
# --sections m1pdl` (the MoE layer at 1, 2, 8 tokens, down plain against PDL), then the engine with NVFP4 experts
# (KKKMKKKM, graphs, --pdl on, batch 1 / 2 / 8), the tree before the cap (.base_src) and after, alternated twice.
# (The cap in nvfp4_m1._launch measured no change and was not committed: `cap = mg.one_wave_cap(grid[0] * grid[1],
# mg._sms(device))` then `smem = mg.cap_blocks(kernel, device, smem, cap)` before its launch_pdl.)
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
step "GPU tests"
timeout 200 python3 -m pytest -rA -p no:cacheprovider tests/kernels/test_nvfp4_m1.py tests/kernels/test_mma_gemv.py \
  2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -20
step "m1pdl"
timeout 150 python3 bench/quant_decode_sweep.py --sections m1pdl --out "$OUT/s27h" 2>&1 | tail -6
i=0
for tree in base new base new; do
  i=$((i + 1))
  src=$PWD/src; [ $tree = base ] && src=$PWD/.base_src/src
  step "engine: KKKMKKKM nvfp4, --pdl on, $tree ($i)"
  PYTHONPATH=/tmp/site:$src timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM \
    --dense-first --quantization nvfp4 --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 2 8 --pdl on \
    --json "$OUT/s27h_model_nvfp4_${i}_$tree.json" 2>&1 | grep -E "decode step|Error|error" | tail -4
done
step "done"
