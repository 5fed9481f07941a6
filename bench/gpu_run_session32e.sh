#!/usr/bin/env bash
# Thirty-second session, fifth call (right after the fourth, on the same machine, its Triton cache warm): the
# fourth call's last command again, which had timed out at 220 s on the fresh machine: real-width KKKM at TP=1,
# graphs on (bench/gpu_run_issue17.sh step's TP=1 command, with a longer timeout).
set -uo pipefail
source bench/gpu_env.sh
CUDA_VISIBLE_DEVICES=0 timeout 400 python3 -m tpserve.cli bench model --device cuda --layers KKKM --tp 1 \
  --prefill 4096 --repeats 1 --decode-steps 16 --batch 1 32 64 --json "$OUT/s32e_kkkm_tp1.json" 2>&1 \
  | grep -vE "^\s*$" | tail -25
