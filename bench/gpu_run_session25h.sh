#!/usr/bin/env bash
# Twenty-fifth session, ninth call: the engine with nvfp4_m1's down kernel under PDL (kernels/pdl.py) against the
# tree before it (d36b936, .base_src = `git archive d36b936 src`), in one call: real-width KKKMKKKM with NVFP4
# experts, CUDA graphs on, decode batch 1 / 2 / 8 under --quant-gemv-backend cuda (the graphs capture the PDL edge).
set -uo pipefail
source bench/gpu_env.sh
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
i=0
for tree in before after before after; do
  i=$((i + 1))
  step "engine: KKKMKKKM nvfp4, cuda, $tree ($i)"
  if [ $tree = before ]; then pp=/tmp/site:$PWD/.base_src/src; else pp=$PYTHONPATH; fi
  PYTHONPATH=$pp timeout 200 python3 -m tpserve.cli bench model --device cuda --layers KKKMKKKM --dense-first \
    --quantization nvfp4 --prefill 2048 --repeats 1 --decode-steps 32 --batch 1 2 8 --quant-gemv-backend cuda \
    --json "$OUT/s25h_model_${i}_$tree.json" 2>&1 | grep -E "decode step|Error|error" | tail -4
done
step "done"
