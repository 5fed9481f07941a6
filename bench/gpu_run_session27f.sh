#!/usr/bin/env bash
# Twenty-seventh session, sixth call: mma_gemv under PDL with the one-wave cap (mma_gemv.one_wave_cap) and FP8 at one
# row through mma_gemv under PDL: the GPU tests (test_mma_gemv, test_pdl), then the engine with FP8 linears (real
# width KKKMKKKM, CUDA graphs, --pdl on, batch 1 / 2 / 8), the tree before (.base_src: `git archive <rev> src`)
# and after, alternated twice.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
step "GPU tests"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_mma_gemv.py tests/kernels/test_pdl.py \
  2>&1 | tail -4
i=0
for tree in base new base new; do
  i=$((i + 1))
  src=$PWD/src; [ $tree = base ] && src=$PWD/.base_src/src
  step "engine: KKKMKKKM fp8, --pdl on, $tree ($i)"
  PYTHONPATH=/tmp/site:$src timeout 120 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM \
    --dense-first --quantization fp8 --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 2 8 --pdl on \
    --json "$OUT/s27f_model_fp8_${i}_$tree.json" 2>&1 | grep -E "decode step|Error|error" | tail -4
done
step "done"
