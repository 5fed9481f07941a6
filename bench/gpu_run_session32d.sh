#!/usr/bin/env bash
# Thirty-second session, fourth call: the engine end to end on one H200 after this session's module moves
# (engine/engine.py choosing the executor, model/plan.ACTIVATION_RESERVE in build_model's CUDA memory plan,
# model/quant_config, paths.cache_dir): the tiny checkpoints' greedy tokens and prefill logits on CUDA against the
# CPU float32 path (bench/gpu_check_tiny.py), decode graphs against eager (--graphs), and the one-GPU command of
# bench/gpu_run_issue17.sh's `step` part (real-width KKKM at TP=1, graphs on), so that the part of that run book
# one GPU can run is known to work on this tree.
set -uo pipefail
source bench/gpu_env.sh
step "tiny checkpoints: CUDA against CPU float32"
timeout 200 python3 bench/gpu_check_tiny.py 2>&1 | tee "$OUT/s32d_tiny.log" | grep -E "^\||rror" | tail -12
step "tiny checkpoints: decode graphs against eager"
timeout 150 python3 bench/gpu_check_tiny.py --graphs 2>&1 | tee "$OUT/s32d_graphs.log" | grep -E "^\||rror" | tail -12
step "real-width KKKM, TP=1 (bench/gpu_run_issue17.sh step's TP=1 command)"
CUDA_VISIBLE_DEVICES=0 timeout 220 python3 -m tpserve.cli bench model --device cuda --layers KKKM --tp 1 \
  --prefill 4096 --repeats 1 --decode-steps 16 --batch 1 32 64 --json "$OUT/s32d_kkkm_tp1.json" 2>&1 \
  | grep -E "^\||^layers|rror" | tail -12
step "done"
