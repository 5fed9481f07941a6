#!/usr/bin/env bash
# One device call on nvidia-h200 (~80 s warm): real-width KKKM batch-1 decode and 1k prefill with the
# indexer backend alternating triton / torch twice (gpu_run_indexer.sh's single pair disagreed with
# itself by 9%: this measures the spread between `bench model` invocations in one call).
source bench/gpu_env.sh >/dev/null
for b in triton torch triton torch; do
  timeout 45 python3 -m tpserve.cli bench model --device cuda --prefill 1024 --repeats 1 --decode-steps 32 --batch 1 \
    --indexer-backend $b 2>&1 | grep -E "^\| (prefill|decode)|Error|error" | sed "s/^/$b /"
done
