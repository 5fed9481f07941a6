#!/usr/bin/env bash
# Fifteenth session, fourth call (~7 min): (1) sparse MLA prefill configs with the scores taken over column chunks
# (queries re-read per chunk instead of held in registers), with each compiled variant's registers and spills;
# (2) the 4k prefill regression seen in the third call (67.2 ms against 56.8 in the fourteenth session's last call,
# where 4k takes the dense MLA path this session did not change): the last commit before this session's work
# (src of 30d61e0, carried as .carry_old/src.tar.gz) against the working tree, alternated, 4k only;
# (3) the demo model's bf16 greedy tokens with --mla-prefill dense vs sparse (its prefill then takes PREFILL).
set -uo pipefail
source bench/gpu_env.sh
step "sparse MLA prefill configs, column chunks"
timeout 200 python3 bench/mla_sparse_bench.py --prefill 4096 --configs \
  h64r64w8c1s2 h64r64w8c1s2q128 h64r64w8c1s2q64 h64r64w8c1s2q256 h64r64w8c1s3q128 h64r32w8c1s2q128 \
  h64r64w4c1s2q128 h64r128w8c1s1q128 \
  --json "$OUT/mla_prefill_qchunk.json" 2>&1 | grep -E "^\||^compiled|Error|error|Traceback" | head -30
step "4k prefill: 30d61e0 vs working tree, alternated"
mkdir -p /tmp/old && tar -xzf .carry_old/src.tar.gz -C /tmp/old
for round in 1 2; do
  for which in old new; do
    src=$PWD/src; [ $which = old ] && src=/tmp/old/src
    echo "round $round: $which"
    PYTHONPATH=/tmp/site:$src timeout 150 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 4096 \
      --repeats 5 --batch 1 --decode-steps 4 --json "$OUT/model_4k_${which}_${round}.json" 2>&1 \
      | grep -E "^\| prefill|Error|error|Traceback" | head -4
  done
done
save_triton_cache
step "demo model, bf16: mla_prefill dense vs sparse"
timeout 90 python3 bench/backend_demo_tokens.py --switch mla_prefill --values dense,sparse 2>&1 | grep -E "^\||Error|error|Traceback" | head -4
step "done"
