#!/usr/bin/env bash
# One device call on nvidia-h200 (< 600 s): decode graphs after the StepGraphs refactor.
#  1. tiny checkpoints: greedy tokens with decode graphs vs eager (gpu_check_tiny.py --graphs);
#  2. real-width KKKM decode (bf16, random weights), graphs vs eager, batch 1 / 32 / 64.
set -uo pipefail
source bench/gpu_env.sh
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
step "tiny checkpoints: graphs vs eager"
timeout 200 python3 bench/gpu_check_tiny.py --graphs --configs default,notail 2>&1 | tee "$OUT/tiny_graphs.log" | grep -E "^\||Error"
step "bench model: real-width KKKM decode"
timeout 300 python3 -m tpserve.cli bench model --device cuda --prefill 4096 --repeats 3 --decode-steps 32 --batch 1 32 64 \
  --compare-eager --plot "$OUT/decode_kkkm.png" --json "$OUT/model_kkkm.json" 2>&1 | tee "$OUT/bench_model.log" | grep -E "^\||captured|Error"
step "done"
