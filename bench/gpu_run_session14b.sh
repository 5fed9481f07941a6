#!/usr/bin/env bash
# Fourteenth session, second call (~8 min): merged linears (model/merged.py, new, default on), async scheduling
# (on since the first call) and the chunked top-k (auto now: triton, chunked past 1,024 pools) together.
# 1. correctness: the tiny checkpoints' greedy tokens with decode graphs vs eager (fp32 exact, bf16), every
#    default on (async scheduling included); the demo model's bf16 greedy tokens with merge_linears off / on and
#    async_scheduling off / on;
# 2. real-width KKKM, defaults: prefill 4k and 16k, decode batch 1, 32, 64; the same with --no-merge-linears;
#    batch 1 with --gemv-backend triton on top of the defaults.
set -uo pipefail
source bench/gpu_env.sh
step "tiny checkpoints: decode graphs vs eager"
timeout 150 python3 bench/gpu_check_tiny.py --graphs 2>&1 | grep -E "^\||Error|error|Traceback" | head -16
for sw in merge_linears async_scheduling; do
  step "demo model, bf16: $sw false vs true"
  timeout 60 python3 bench/backend_demo_tokens.py --switch $sw --values false,true 2>&1 \
    | grep -E "^\||Error|error|Traceback" | head -4
done
for m in merge-linears no-merge-linears; do
  step "real-width KKKM, --$m: prefill 4k / 16k, decode"
  timeout 130 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 16384 --repeats 3 \
    --decode-steps 48 --batch 1 32 64 --$m --json "$OUT/model_kkkm_$m.json" 2>&1 \
    | grep -E "^\| (decode|prefill)|Error|error|Traceback" | head -8
done
step "real-width KKKM decode batch 1, defaults + --gemv-backend triton"
timeout 70 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
  --decode-steps 48 --batch 1 --gemv-backend triton --json "$OUT/model_kkkm_gemv_triton.json" 2>&1 \
  | grep -E "^\| decode|Error|error|Traceback" | head -4
save_triton_cache
step "done"
