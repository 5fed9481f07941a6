#!/usr/bin/env bash
# Twenty-seventh session, seventh call: the GPU tests listed (test_mma_gemv, test_pdl); `quant_decode_sweep.py
# --sections mmapdl` (w8a16_gemv / w4a16_gemv defaults, plain against PDL chains, 1-8 rows); the engine with FP8
# linears (KKKMKKKM, graphs, --pdl on, batch 1 / 2 / 8) for three trees alternated twice: base (.base_src, the tree
# before the cap), new, and new without the cap (.var_src: one_wave_cap returning 0; FP8 one row through mma_gemv
# under PDL kept).
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
ln -sfn "$PWD/src/tpserve/builtin" .var_src/src/tpserve/builtin
step "GPU tests"
timeout 200 python3 -m pytest -rA -p no:cacheprovider tests/kernels/test_mma_gemv.py tests/kernels/test_pdl.py \
  2>&1 | grep -E "^(PASSED|FAILED|ERROR)|passed|failed" | tail -40
step "mmapdl"
timeout 200 python3 bench/quant_decode_sweep.py --sections mmapdl --out "$OUT/s27g" 2>&1 | tail -20
i=0
for tree in base new nocap base new nocap; do
  i=$((i + 1))
  src=$PWD/src; [ $tree = base ] && src=$PWD/.base_src/src; [ $tree = nocap ] && src=$PWD/.var_src/src
  step "engine: KKKMKKKM fp8, --pdl on, $tree ($i)"
  PYTHONPATH=/tmp/site:$src timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM \
    --dense-first --quantization fp8 --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 2 8 --pdl on \
    --json "$OUT/s27g_model_fp8_${i}_$tree.json" 2>&1 | grep -E "decode step|Error|error" | tail -4
done
step "done"
