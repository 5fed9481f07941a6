#!/usr/bin/env bash
# Twenty-third session, seventh to ninth calls (~1 min each): the built-in model's FP8 decode under
# --quant-gemv-backend cuda at 6acbe92 (.base_src = `git archive 6acbe92 src`) and on the working tree, in one call
# (bench/quant_gemv_tokens.py). Seventh call: the tree launched through the device context and copied any view not
# 16-byte aligned; eighth: no device switch; ninth: the scales asked only for their own element's alignment.
set -uo pipefail
source bench/gpu_env.sh
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
for tree in before after; do
  step "built-in model, FP8, $tree"
  if [ $tree = before ]; then pp=/tmp/site:$PWD/.base_src/src; else pp=$PYTHONPATH; fi
  PYTHONPATH=$pp timeout 150 python3 bench/quant_gemv_tokens.py --batch 8 --max-tokens 64 --rounds 3 \
    --json "$OUT/s23f_tokens_$tree.json" 2>&1 | grep -E "^(cuda|triton)|captur|Traceback" | tail -8
done
step "done"
