#!/usr/bin/env bash
# Twenty-eighth session, third call: x's chunk in the stages (second call: 1 token 43.9 -> 42.2 us, 2 tokens ~4%
# slower). Block timelines at 2 tokens in both trees, then `--sections m1x` (seeded routings: stage depths, down_sum
# held to 2 or 3 blocks an SM) new / base / new.
set -uo pipefail
source bench/gpu_env.sh
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
for tree in base new; do
  src=$PWD/src; [ $tree = base ] && src=$PWD/.base_src/src
  step "timeline 2 tokens, $tree"
  PYTHONPATH=/tmp/site:$src timeout 120 python3 bench/m1_timeline.py --tokens 2 --json "$OUT/s28c_timeline_$tree.json" 2>&1 | tee "$OUT/s28c_timeline_$tree.txt" | head -9
done
for tree in new base new; do
  src=$PWD/src; [ $tree = base ] && src=$PWD/.base_src/src
  step "m1x $tree"
  PYTHONPATH=/tmp/site:$src timeout 200 python3 bench/quant_decode_sweep.py --sections m1x --out "$OUT/s28c_m1x_$tree" 2>&1 | grep -E "MoE|  |Error|error" | tail -16
done
step "done"
