#!/usr/bin/env bash
# One device call on nvidia-h200 for the next session (~8 min): what the tenth session built but could not
# measure (its device time ran out).
# 1. kernels per decode step with the indexer's in-kernel pool rows and selection expansion (308 / 330 / 365
#    for decode / verify / drafts before them), and greedy tokens per switch;
# 2. batch 64, plain vs adaptive (k = 0 steps on the plain sampling path; 0.86-0.88x before);
# 3. bench spec batch 1 (1.56x before);
# 4. the issue's own config, real-width KKKM, at batch 1, 32, 64 (1.95-2.15 ms at batch 1 in the ninth session);
# 5. prefill 16k, dense vs sparse MLA prefill (sparse now runs the Triton sparse-MLA kernel).
set -uo pipefail
source bench/gpu_env.sh
step "demo model greedy tokens, indexer_backend triton vs torch (bf16)"
timeout 90 python3 bench/backend_demo_tokens.py --switch indexer_backend 2>&1 | grep -E "^\||Error|error"
step "demo model kernels per step"
timeout 80 python3 bench/decode_profile.py --device cuda --dtype bfloat16 --batch 1 --k 3 --steps 16 --top 8 \
  --json "$OUT/profile.json" 2>&1 | grep -E "^\| (execute|draft|commit) |^##"
step "bench spec, batch 64, off vs adaptive"
timeout 110 python3 -m tpserve.cli bench spec --device cuda --batch 64 --k 3 --no-fixed --max-tokens 96 \
  --repeats 3 --json "$OUT/spec_b64.json" 2>&1 | grep -E "^\| 64 |Error|error"
step "bench spec, batch 1"
timeout 100 python3 -m tpserve.cli bench spec --device cuda --batch 1 --k 3 --max-tokens 96 \
  --json "$OUT/spec_b1.json" 2>&1 | grep -E "^\| 1 |Error|error"
step "real-width KKKM decode"
timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 1024 --repeats 1 \
  --decode-steps 32 --batch 1 32 64 --json "$OUT/model_kkkm.json" 2>&1 | grep -E "^\| (decode|prefill)|Error|error"
for mode in dense sparse; do
  step "real-width KKKM prefill 16k, mla_prefill=$mode"
  timeout 100 python3 -m tpserve.cli bench model --device cuda --layers KKKM --prefill 16384 --repeats 1 \
    --decode-steps 0 --batch --mla-prefill $mode --json "$OUT/prefill16k_$mode.json" 2>&1 | grep -E "^\| prefill|Error|error"
done
save_triton_cache
step "done"
