#!/usr/bin/env bash
# Twenty-fifth session, fourth call: the engine before and after down_sum (nvfp4_m1's down kernel summing a token's
# choices, used at one token): real-width KKKMKKKM with NVFP4 experts, decode batch 1 / 8 under
# --quant-gemv-backend cuda, at 9d36acf (.base_src = `git archive 9d36acf src`) and on the working tree, in one call.
set -uo pipefail
source bench/gpu_env.sh
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
for tree in before after; do
  step "engine: KKKMKKKM nvfp4, cuda, $tree"
  if [ $tree = before ]; then pp=/tmp/site:$PWD/.base_src/src; else pp=$PYTHONPATH; fi
  PYTHONPATH=$pp timeout 240 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first \
    --quantization nvfp4 --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 8 --quant-gemv-backend cuda \
    --json "$OUT/s25d_model_$tree.json" 2>&1 | tail -6
done
save_triton_cache
step "done"
