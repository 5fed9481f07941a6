#!/usr/bin/env bash
# Twenty-fifth session, first call: nvfp4_m1's new down kernel that sums a token's choices ("down_sum") and W's
# first stages issued before x is staged (all modes). GPU tests of kernels/nvfp4_m1.py; quant_decode_sweep
# --sections m1sum (down_sum's configs against down per pair + combine, 1 / 2 / 8 tokens); --sections m1def at
# 9d36acf (.base_src = `git archive 9d36acf src`) and on the working tree in one call.
set -uo pipefail
source bench/gpu_env.sh
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
step "GPU test"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>/dev/null
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_nvfp4_m1.py 2>&1 | tail -4
step "m1sum"
timeout 200 python3 bench/quant_decode_sweep.py --sections m1sum --out "$OUT" 2>&1 | tee "$OUT/s25_m1sum.log" \
  | grep -v "^  .*WRONG" | tail -40
for tree in before after; do
  step "m1def $tree"
  if [ $tree = before ]; then pp=/tmp/site:$PWD/.base_src/src; else pp=$PYTHONPATH; fi
  PYTHONPATH=$pp timeout 150 python3 bench/quant_decode_sweep.py --sections m1def --out "$OUT/$tree" 2>&1 \
    | tee "$OUT/s25_m1def_$tree.log" | tail -16
done
save_triton_cache
step "done"
