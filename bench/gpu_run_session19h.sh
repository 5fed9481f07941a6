#!/usr/bin/env bash
# Nineteenth session, eighth call (~2 min): issue 10's "4k no worse per token than 16k" (14.2 against 10.0 us a token
# in the eighteenth session): real-width KKKM bf16, one prefill step of 4,096 and of 16,384 tokens profiled by kernel
# (torch.profiler, `bench model --profile-prefill`), each with its timed prefill (3 repeats), graphs off.
set -uo pipefail
source bench/gpu_env.sh
for n in 4096 16384; do
  step "KKKM bf16 prefill $n, profiled"
  timeout 200 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill $n --repeats 3 --batch 1 \
    --decode-steps 2 --enforce-eager --profile-prefill $n --json "$OUT/kkkm_prefill_$n.json" 2>&1 \
    | tee "$OUT/kkkm_prefill_$n.log" | grep -E "^\| |device busy|profile:|Error|Traceback" | head -40
done
step "done"
