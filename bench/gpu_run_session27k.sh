#!/usr/bin/env bash
# Twenty-seventh session, eleventh call: the Triton GEMV under PDL with the one-wave cap (gemv_triton._Caps; PDL at
# 2-16 rows only with it): `pdl_chain.py` at 1 row (plain / PDL / PDL capped) and 8 rows (plain / PDL capped / PDL
# uncapped), test_pdl.py, then the engine with NVFP4 experts (KKKMKKKM, graphs, --pdl on, batch 1 / 2 / 8), the tree
# before (.base_src) and after, once each.
set -uo pipefail
source bench/gpu_env.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
for rows in 1 8; do
  step "pdl_chain M=$rows"
  timeout 120 python3 bench/pdl_chain.py --rows $rows --repeats 8 --rounds 3 --json "$OUT/s27k_pdl_chain_m$rows.json" \
    2>&1 | tail -9
done
step "GPU tests"
timeout 120 python3 -m pytest -p no:cacheprovider tests/kernels/test_pdl.py 2>&1 | grep -E "^(FAILED|ERROR)|passed|failed" | tail -8
for tree in base new; do
  src=$PWD/src; [ $tree = base ] && src=$PWD/.base_src/src
  step "engine: KKKMKKKM nvfp4, --pdl on, $tree"
  PYTHONPATH=/tmp/site:$src timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM \
    --dense-first --quantization nvfp4 --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 2 8 --pdl on \
    --json "$OUT/s27k_model_nvfp4_$tree.json" 2>&1 | grep -E "decode step|Error|error" | tail -4
done
step "done"
