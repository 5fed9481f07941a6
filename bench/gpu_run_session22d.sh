#!/usr/bin/env bash
# Twenty-second session, fourth call (~5 min): the h2d change (engine/h2d.py: non-blocking copies in the sampler,
# the speculator's sampled verify, the eager batch) and top-k by topk must not change a token on the GPU: greedy
# and seeded sampled tokens of the built-in model (bench/sampled_tokens.py), without and with speculation, on the
# tree before (.base_src = `git archive 2c38bf2 src`) and after, compared file by file; then the tiny checkpoints
# on CUDA against the CPU path with graphs (bench/gpu_check_tiny.py --graphs).
set -uo pipefail
source bench/gpu_env.sh
ln -sfn "$PWD/src/tpserve/builtin" .base_src/src/tpserve/builtin
for spec in "" "--speculative"; do
  step "tokens ${spec:-plain}: before and after"
  PYTHONPATH=/tmp/site:$PWD/.base_src/src timeout 120 python3 bench/sampled_tokens.py --device cuda $spec \
    --out "$OUT/tokens_before${spec}.json" 2>&1 | grep -E "wrote|Error|error|Traceback"
  timeout 120 python3 bench/sampled_tokens.py --device cuda $spec --out "$OUT/tokens_after${spec}.json" 2>&1 \
    | grep -E "wrote|Error|error|Traceback"
  cmp "$OUT/tokens_before${spec}.json" "$OUT/tokens_after${spec}.json" && echo "tokens ${spec:-plain}: identical"
done
step "tiny checkpoints, CUDA against CPU, graphs"
timeout 200 python3 bench/gpu_check_tiny.py --graphs 2>&1 | grep -E "^\||Error|error|Traceback" | head -16
step "done"
