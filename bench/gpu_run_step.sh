#!/usr/bin/env bash
# One device call on nvidia-h200 (< 600 s): the decode-step issue's GPU checks.
#  1. tiny checkpoints: greedy tokens with decode CUDA graphs (padded buckets) vs --enforce-eager,
#     float32 and bf16;
#  2. real-width KKKM layers (bf16), eager then graphs in one process call each, decode batch 1/32/64,
#     prefill 4k/16k; table with floors, ratios, PNG.
# Needs the wheels in .whl (bench/gpu_env.sh lists them). Logs, JSON and PNG go to $OUT.
set -uo pipefail
source bench/gpu_env.sh
step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv,noheader
python3 -c 'import torch, triton, fla; print("torch", torch.__version__, "triton", triton.__version__, "fla", fla.__version__)'
step "tiny checkpoints: graphs vs eager"
timeout 260 python3 bench/gpu_check_tiny.py --graphs --configs "${CONFIGS:-default,shared,variant,notail}" 2>&1 \
  | tee "$OUT/tiny_graphs.log" | grep "^|"
step "real-width KKKM, TP=1: eager vs graphs"
timeout 330 python3 -m tpserve.cli bench model --device cuda --prefill 4096 16384 --repeats 3 --decode-steps 32 \
  --batch 1 32 64 --compare-eager --plot "$OUT/decode_kkkm.png" --json "$OUT/model_kkkm.json" 2>&1 \
  | tee "$OUT/model.log" | grep -E "^\||^layers|^eager|^graphs|^default|capture"
step "done"
