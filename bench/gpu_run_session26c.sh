#!/usr/bin/env bash
# Twenty-sixth session, third call: --pdl with the KDA conv / gate and the MoE routing kernels too, and the GEMV
# with PDL at one row only. The GPU tests; the two interpreter tests that failed in the second call, on this tree
# and on the tree before PDL (.base_src = `git archive 3668a1b src`); the GEMV chains; the engine with --pdl off / on
# alternated twice in one call (real-width KKKMKKKM, NVFP4 experts, CUDA graphs, batch 1 / 2 / 8).
set -uo pipefail
source bench/gpu_env.sh
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
step "GPU tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_pdl.py tests/kernels/test_kda_prep.py \
  tests/kernels/test_route_triton.py tests/kernels/test_act_triton.py tests/kernels/test_mhc.py 2>&1 | tail -4
for tree in after before; do
  step "interpreter tests on the GPU machine, $tree"
  if [ $tree = before ]; then pp=/tmp/site:$PWD/.base_src/src; else pp=$PYTHONPATH; fi
  PYTHONPATH=$pp timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/kernels/test_gemv_triton.py \
    tests/kernels/test_norm_triton.py 2>&1 | grep -E "Error|error|passed|failed" | head -8
done
for rows in 1 8; do
  step "pdl_chain M=$rows"
  timeout 200 python3 bench/pdl_chain.py --rows $rows --repeats 8 --rounds 3 --json "$OUT/s26c_pdl_chain_m$rows.json" \
    2>&1 | tail -5
done
i=0
for mode in off on off on; do
  i=$((i + 1))
  step "engine: KKKMKKKM nvfp4, --pdl $mode ($i)"
  timeout 240 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first \
    --quantization nvfp4 --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 2 8 --pdl $mode \
    --json "$OUT/s26c_model_${i}_$mode.json" 2>&1 | grep -E "decode step|Error|error" | tail -4
done
save_triton_cache
step "done"
